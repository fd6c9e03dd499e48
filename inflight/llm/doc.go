// Package llm is what the HTTP edge knows of LLM APIs (OpenAI- and
// Anthropic-style JSON): a request's cost in tokens estimated from its
// body, the model it names, the usage its response reports, include_usage,
// and the output estimate a zone learns from those reports.
package llm
