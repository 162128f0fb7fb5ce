// Starts Swagger UI on the service's own OpenAPI document (a file, not an inline script: the page's CSP allows
// scripts from its own origin only). No validator badge: it would call a third-party origin.
window.addEventListener("load", () => {
  window.ui = SwaggerUIBundle({
    url: new URL("openapi.json", document.baseURI).href,
    dom_id: "#swagger-ui",
    validatorUrl: null,
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    layout: "BaseLayout",
  });
});
