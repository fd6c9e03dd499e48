package browser

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"
)

// TestLivePageBehindBasicAuth: the live page behind basic_auth reads the
// state with the credentials the browser keeps and shows the zone, with no
// error, whether it was opened as http://user:pass@host/inflight/ (a fetch
// of a URL with credentials in it would fail) or through the browser's
// login prompt.
func TestLivePageBehindBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	site := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	load(t, fmt.Sprintf(`%s {
	handle /inflight/* {
		basic_auth {
			admin %s
		}
		inflight_ui
	}
	handle {
		inflight {
			total 4
			zone guarded
		}
		respond "ok"
	}
}
`, site, hash))
	if status := <-send(site + "/"); status != 200 {
		t.Fatalf("a request to the zone: status %d, want 200", status)
	}
	t.Run("credentials in the URL", func(t *testing.T) {
		u, _ := url.Parse(site + "/inflight/")
		u.User = url.UserPassword("admin", "s3cret")
		ctx := browser(t)
		if err := chromedp.Do(ctx, chromedp.Navigate(u.String())); err != nil {
			t.Fatal(err)
		}
		showsZone(t, ctx, u.Redacted())
	})
	t.Run("login prompt", func(t *testing.T) {
		ctx := browser(t)
		answerLoginPrompts(t, ctx, "admin", "s3cret")
		if err := chromedp.Do(ctx, chromedp.Navigate(site+"/inflight/")); err != nil {
			t.Fatal(err)
		}
		showsZone(t, ctx, site+"/inflight/ through the login prompt")
	})
}

// showsZone waits until the page shows the zone guarded and no error.
func showsZone(t *testing.T, ctx context.Context, opened string) {
	t.Helper()
	type shown struct {
		Status string `json:"status"`
		Zone   bool   `json:"zone"`
	}
	var got shown
	deadline := time.Now().Add(within)
	for !got.Zone || strings.Contains(got.Status, "cannot") {
		if time.Now().After(deadline) {
			t.Fatalf("opened as %s, the page shows status %q and the zone: %v; want the zone and no error", opened, got.Status, got.Zone)
		}
		time.Sleep(20 * time.Millisecond)
		got, _ = chromedp.Run(ctx, chromedp.Evaluate[shown](`({status: document.getElementById('status').textContent,
			zone: document.querySelector('[data-zone="guarded"]') !== null})`)) // an error (the page loading): asked again
	}
}

// answerLoginPrompts answers every login prompt of the browser's tab with
// user and password, as a person types them in, and lets every other
// request through.
func answerLoginPrompts(t *testing.T, ctx context.Context, user, password string) {
	t.Helper()
	events := make(chan any, 256)
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev.(type) {
		case *fetch.EventRequestPaused, *fetch.EventAuthRequired:
			events <- ev // a page of a few requests: never full
		}
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			var ev any
			select {
			case ev = <-events:
			case <-ctx.Done():
				return
			}
			chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				var err error
				switch e := ev.(type) {
				case *fetch.EventRequestPaused:
					_, err = cdp.Call(ctx, tg, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: e.RequestID})
				case *fetch.EventAuthRequired:
					_, err = cdp.Call(ctx, tg, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: e.RequestID,
						AuthChallengeResponse: &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: user, Password: password}})
				}
				return err
			})) // an error: the tab is gone
		}
	}()
	handleAuth := true
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth})
		return err
	})); err != nil {
		t.Fatal(err)
	}
}
