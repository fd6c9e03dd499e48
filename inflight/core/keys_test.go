package core

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestLabelValuesAreValidUTF8(t *testing.T) {
	for key, want := range map[string]string{
		"plain":          "plain",
		"caf\u00e9":      "caf\u00e9",
		"bad\xff\xfeend": `bad\xff\xfeend`,
		"\xc3":           `\xc3`, // a cut multi-byte sequence
		`a\b`:            `a\\b`,
		`\xff`:           `\\xff`, // the text, not the byte
		overflowKey:      `\x5foverflow`,
	} {
		got := LabelValue(key)
		if got != want || !utf8.ValidString(got) {
			t.Errorf("LabelValue(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestLabelValuesAreOneToOne: keys that differ, however they are made of
// bytes, backslashes and escape-like text, get labels that differ.
func TestLabelValuesAreOneToOne(t *testing.T) {
	parts := []string{"\xff", `\xff`, `\`, `\\`, "x", "ff", "\xc3", "\u00e9", `\x5f`, "_", "overflow"}
	keys := []string{overflowKey}
	for _, a := range parts {
		for _, b := range parts {
			keys = append(keys, a, a+b)
			for _, c := range parts {
				keys = append(keys, a+b+c)
			}
		}
	}
	seen := map[string]string{}
	for _, key := range keys {
		label := LabelValue(key)
		if other, ok := seen[label]; ok && other != key {
			t.Fatalf("keys %q and %q both read %q", other, key, label)
		}
		seen[label] = key
	}
}

func TestMaxJSON(t *testing.T) {
	for in, want := range map[string]Max{
		`20`:             {Fixed: 20},
		`"20"`:           {Fixed: 20},
		`"{tenant_max}"`: {Placeholder: "{tenant_max}"},
	} {
		var m Max
		if err := json.Unmarshal([]byte(in), &m); err != nil || m != want {
			t.Errorf("%s: %+v, %v; want %+v", in, m, err, want)
		}
	}
	for _, in := range []string{`0`, `-1`, `1.5`, `"x"`, `true`} {
		var m Max
		if err := json.Unmarshal([]byte(in), &m); err == nil {
			t.Errorf("%s: accepted as %+v, want an error", in, m)
		}
	}
	out, _ := json.Marshal([]Max{{Fixed: 3}, {Placeholder: "{m}"}})
	if string(out) != `[3,"{m}"]` {
		t.Errorf("marshal: %s", out)
	}
}
