"""The batch APIs' operations, one package per protocol (`openai`, `anthropic`): create, read, list, cancel,
pause, retry and delete a batch, and the OpenAI-shaped files and uploads, each in its API's own terms (its
parameters, its refusals, how its objects look). They parse and present; what a batch does is the service's
use cases, which they call.

They sit above the service and below the routes: an operation may use the service, records and storage and
its protocol's description (`protocols/<name>`), and only the routes (`api/`) import them. The service never
imports an operation, so the shared code stays the same for every protocol.
"""
