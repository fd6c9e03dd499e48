package caddyinflight_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The documents describe the product as it is; its history lives in git.
var (
	// commitHash is a word of 7 to 40 lowercase hex digits; one that
	// follows '#' is a hashed key as the admin API shows it (#713bacc1…).
	commitHash = regexp.MustCompile(`(?:^|[^#\w])([0-9a-f]{7,40})\b`)
	// issueNumber is #N as a word (not a zone's position after its name,
	// api.example.com#1 or :8080#1, nor an anchor's #1-…), or "issue N".
	issueNumber = regexp.MustCompile(`(?i)(?:^|[^\w.:/#-])(#\d{1,5})(?:[^\w-]|$)|\b((?:issues?|pull requests?|PRs?)\s+#?\d{1,5})\b`)
	aimWord     = regexp.MustCompile(`(?i)\b(aims?)\b`)
	isoDate     = regexp.MustCompile(`\b(20\d\d-[01]\d-[0-3]\d)\b`)
)

// historyMarks returns what in line reads as history: commit hashes,
// issue numbers, "aim"s and, unless dates are allowed, dates.
func historyMarks(line string, datesAllowed bool) []string {
	var marks []string
	for _, m := range commitHash.FindAllStringSubmatch(line, -1) {
		if strings.ContainsAny(m[1], "abcdef") && strings.ContainsAny(m[1], "0123456789") { // a word of letters (facade) or a number is not a hash
			marks = append(marks, "commit hash "+m[1])
		}
	}
	for _, m := range issueNumber.FindAllStringSubmatch(line, -1) {
		marks = append(marks, "issue number "+m[1]+m[2])
	}
	for _, m := range aimWord.FindAllStringSubmatch(line, -1) {
		marks = append(marks, "the word "+m[1])
	}
	if !datesAllowed {
		for _, m := range isoDate.FindAllStringSubmatch(line, -1) {
			marks = append(marks, "date "+m[1])
		}
	}
	return marks
}

// TestHistoryMarks: what historyMarks flags, and what it leaves alone.
func TestHistoryMarks(t *testing.T) {
	for _, c := range []struct {
		line string
		want int
	}{
		{"measured at commit fa352e8, three runs", 1},
		{"(2424f6b: hand-off, lost-reply retry)", 1},
		{"a full hash 0123456789abcdef0123456789abcdef01234567 here", 1},
		{"### #29's cases", 1},
		{"as #29 saw, and issue 31 too", 2},
		{"see issue #7.", 1},
		{"The issue's aim of one request's units", 1},
		{"this page aims at 10 µs", 1},
		{"**Script time: at the Aim.**", 1},
		{"three runs (2026-12-02)", 1},
		{"zones api.example.com#1, api.example.com#2 and :8080#1, `layer4 :5432#1`", 0},
		{`"key":"#713bacc11ef7e3ea","held":3},{"key":"#b73bd3a4b44f4e5b"`, 0},
		{"1048576 bytes, 1000000 keys, 99999999999999999999", 0},
		{"deadbeef and cafebabe are words, not hashes; so is facade", 0},
		{"[Fair sharing](waiting.md#fair-sharing), [x](#1-first)", 0},
		{"aimed, claim, maim", 0},
	} {
		if got := historyMarks(c.line, false); len(got) != c.want {
			t.Errorf("%q: flagged %q, want %d marks", c.line, got, c.want)
		}
	}
	if got := historyMarks("three runs (2026-12-02)", true); len(got) != 0 {
		t.Errorf("a date where dates are allowed: flagged %q", got)
	}
}

// TestDocumentsHoldNoHistory: README.md and docs/*.md hold no commit
// hash, issue number or "aim", and no date outside docs/performance.md
// (the measurements page; history lives in git).
func TestDocumentsHoldNoHistory(t *testing.T) {
	for _, file := range documents(t) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, mark := range historyMarks(line, file == "docs/performance.md") {
				t.Errorf("%s:%d: %s: the documents describe the product as it is (history lives in git)", file, i+1, mark)
			}
		}
	}
}
