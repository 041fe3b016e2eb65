"""Wire protocols: each module turns its API's request into a `ChatRequest` and a `Reply` into its
answer (`parse_request`, `render_reply`, `render_stream`, `render_error`), with no state."""
