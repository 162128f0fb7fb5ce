"""One router per protocol or concern; `api.app` includes them all."""
