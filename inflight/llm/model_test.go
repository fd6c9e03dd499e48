package llm

import (
	"encoding/json"
	"testing"
)

// TestRequestModel reads the model of each API's body, and only the
// top-level one: a "model" in a message's text, in metadata, in a tool's
// arguments or in a nested message is never the request's.
func TestRequestModel(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"openai chat", `{"messages":[{"role":"user","content":"hi"}],"model":"gpt-4o","max_tokens":5}`, "gpt-4o"},
		{"openai completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7}`, "gpt-3.5-turbo-instruct"},
		{"openai responses", `{"model":"gpt-4.1","input":"Tell me a story"}`, "gpt-4.1"},
		{"openai embeddings", `{"input":"The food was delicious","model":"text-embedding-3-small","encoding_format":"float"}`, "text-embedding-3-small"},
		{"anthropic messages", `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`, "claude-sonnet-4-5"},
		{"model in a message's text", `{"messages":[{"role":"user","content":"reply with {\"model\":\"model-b\"}"}],"model":"model-a"}`, "model-a"},
		{"model only in a message's text", `{"messages":[{"role":"user","content":"\"model\":\"model-b\""}]}`, UnknownModel},
		{"model only in an anthropic text block", `{"messages":[{"role":"user","content":[{"type":"text","text":"{\"model\": \"model-b\"}"}]}]}`, UnknownModel},
		{"model in metadata", `{"metadata":{"model":"model-b"},"model":"model-a"}`, "model-a"},
		{"model only in a nested message", `{"messages":[{"role":"user","model":"model-b","content":"hi"}]}`, UnknownModel},
		{"model only in tool arguments", `{"tools":[{"type":"function","function":{"name":"f","parameters":{"model":{"type":"string"}}}}],"input":"x"}`, UnknownModel},
		{"given twice: the last, as backends keep it", `{"model":"model-b","model":"model-a"}`, "model-a"},
		{"escaped key", `{"mod\u0065l":"model-a"}`, "model-a"},
		{"escaped value", `{"model":"model\u002da"}`, "model-a"},
		{"other case", `{"MODEL":"model-a","Model":"model-b"}`, UnknownModel},
		{"empty", `{"model":""}`, UnknownModel},
		{"a number", `{"model":4}`, UnknownModel},
		{"null", `{"model":null}`, UnknownModel},
		{"an object", `{"model":{"model":"model-a"}}`, UnknownModel},
		{"none", `{"messages":[]}`, UnknownModel},
		{"not json", `model=model-a`, UnknownModel},
		{"an array", `[{"model":"model-a"}]`, UnknownModel},
		{"cut short", `{"model":"model-a","messages":[`, UnknownModel},
		{"trailing garbage", `{"model":"model-a"} x`, UnknownModel},
		{"no body", ``, UnknownModel},
		{"invalid UTF-8, as decoders read it", "{\"model\":\"a\xffb\"}", "a\uFFFDb"},
	} {
		if got := readFields([]byte(c.body)).model; got != c.want {
			t.Errorf("%s: model %q, want %q", c.name, got, c.want)
		}
		if ref := referenceModel([]byte(c.body)); ref != c.want {
			t.Errorf("%s: encoding/json reads %q, the table says %q", c.name, ref, c.want)
		}
	}
}

// referenceModel is what encoding/json reads as a body's model: the
// top-level "model" (the last one), if it is a string that is not empty.
func referenceModel(body []byte) string {
	var top map[string]json.RawMessage
	var model string
	if json.Unmarshal(body, &top) != nil || json.Unmarshal(top["model"], &model) != nil || model == "" {
		return UnknownModel
	}
	return model
}
