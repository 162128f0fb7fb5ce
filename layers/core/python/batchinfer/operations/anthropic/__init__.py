"""Anthropic's Message Batches operations (`/v1/messages/batches`). Its description (ids, shapes) is
`protocols.anthropic`; the check of one request's `params` is the service's (`service.creating.message_params`),
since interactive Messages calls make the same one."""
