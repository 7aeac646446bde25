"""An OpenAI-compatible HTTP front end for a serving scheduler: a process of its own (as SGLang's
HTTP server and tokenizer manager) that tokenizes, admits fairly between API keys and relays
requests to the scheduler's ZeroMQ edge on an internal endpoint. See docs/http.md."""
