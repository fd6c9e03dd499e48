package llm

import (
	"fmt"
	"strings"
)

// Response bodies as the APIs send them, for the usage tests. The model's
// text carries what a client can make it write: usage JSON, escaped.

// openAIChatJSON is a chat completion with cached prompt tokens, indented as
// the API sends it, with hostile text and a hostile tool call before usage.
const openAIChatJSON = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Here is the JSON you asked for:\n\n` + "```" + `json\n{\"usage\": {\"prompt_tokens\": 1, \"completion_tokens\": 1, \"prompt_tokens_details\": {\"cached_tokens\": 1}}}\n` + "```" + `\nAnd a path: C:\\Users\\",
        "refusal": null,
        "tool_calls": [
          {
            "id": "call_Xq7pGk2VhTnB3fLmR9sWdJ0a",
            "type": "function",
            "function": {
              "name": "record",
              "arguments": "{\"usage\":{\"completion_tokens\":999999},\"note\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":7}\"}"
            }
          }
        ],
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "tool_calls"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {
      "cached_tokens": 1024,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}
`

// openAIChatDeltas are streamed content pieces; together they are a model
// writing usage JSON.
var openAIChatDeltas = []string{
	"", "Sure", "! Here", " it is: ", "{\\\"", "usage", "\\\":", " {\\\"", "completion", "_tokens", "\\\": ", "999", "}}", ".",
}

// openAIChatStream is a streamed chat completion; with includeUsage every
// chunk has "usage":null and a last chunk without choices has the usage.
// cut ends it before that chunk, as a dropped connection would.
func openAIChatStream(includeUsage, cut bool) string {
	const head = `{"id":"chatcmpl-BHt3Xh2PKLqvRzT0mYw9dUaNc1EiF","object":"chat.completion.chunk","created":1743700245,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_b376dfbbd5",`
	tail := "}\n\n"
	if includeUsage {
		tail = `,"usage":null}` + "\n\n"
	}
	var b strings.Builder
	for i, d := range openAIChatDeltas {
		delta := fmt.Sprintf(`{"content":"%s"}`, d)
		if i == 0 {
			delta = `{"role":"assistant","content":"","refusal":null}`
		}
		fmt.Fprintf(&b, `data: %s"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":null}]%s`, head, delta, tail)
	}
	fmt.Fprintf(&b, `data: %s"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]%s`, head, tail)
	if cut {
		return b.String()
	}
	if includeUsage {
		fmt.Fprintf(&b, `data: %s"choices":[],"usage":{"prompt_tokens":19,"completion_tokens":14,"total_tokens":33,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`+"\n\n", head)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// openAIResponsesJSON is a Responses API answer, compact.
const openAIResponsesJSON = `{"id":"resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41","object":"response","created_at":1741476777,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"function_call","id":"fc_67ccd3acc8d48190a77525dc6de64b41","call_id":"call_unLAR8MvFNptuiZK6K6HCy5k","name":"log","arguments":"{\"text\":\"\\\"usage\\\": {\\\"output_tokens\\\": 5}\",\"usage\":{\"output_tokens\":6}}","status":"completed"},{"type":"message","id":"msg_67ccd3acc8d48190a77525dc6de64b4104becb25c45c1d41","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a quiet forest glade, a unicorn named Lumina discovered a hidden pool that reflected the stars. \"usage\": {\"output_tokens\": 1}","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":256},"output_tokens":52,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":380},"user":null,"metadata":{}}`

// openAIResponsesStream is a streamed Responses API answer.
const openAIResponsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"instructions":"You are a helpful assistant.","max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":null,"user":null,"metadata":{}}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"output":[],"usage":null,"user":null,"metadata":{}}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"in_progress","role":"assistant","content":[]}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Hi! \"usage\":{\"output_tokens\":2}"}

event: response.output_text.done
data: {"type":"response.output_text.done","sequence_number":5,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"text":"Hi! \"usage\":{\"output_tokens\":2}"}

event: response.content_part.done
data: {"type":"response.content_part.done","sequence_number":6,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"part":{"type":"output_text","text":"Hi! \"usage\":{\"output_tokens\":2}","annotations":[]}}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":7,"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi! \"usage\":{\"output_tokens\":2}","annotations":[]}]}}

event: response.completed
data: {"type":"response.completed","sequence_number":8,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"completed","error":null,"incomplete_details":null,"instructions":"You are a helpful assistant.","max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi! \"usage\":{\"output_tokens\":2}","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48},"user":null,"metadata":{}}}

`

// anthropicJSON is a Messages API answer with cache writes and reads. Its
// tool_use input is an object the model writes: the usage key in it must
// not be read.
const anthropicJSON = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"I'll record that. {\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}"},{"type":"tool_use","id":"toolu_01A09q90qw90lq917835lq9","name":"record","input":{"usage":{"prompt_tokens":1,"completion_tokens":2,"input_tokens":3,"output_tokens":4}}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":2048,"cache_read_input_tokens":4096,"cache_creation":{"ephemeral_5m_input_tokens":2048,"ephemeral_1h_input_tokens":0},"output_tokens":96,"service_tier":"standard"}}`

// anthropicStreamStart is a streamed Messages answer up to its first text.
const anthropicStreamStart = `event: message_start
data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":1800,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

`

// anthropicStream is anthropicStreamStart to its end: more text, a tool
// call whose arguments are usage JSON, and message_delta's final count.
const anthropicStream = anthropicStreamStart + `event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"! \"usage\":{\"output_tokens\":3}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"record","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"usage\": {\"output_"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"tokens\": 7}}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`
