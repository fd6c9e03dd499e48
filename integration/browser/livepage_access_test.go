package browser

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"
)

// TestLivePageWithCredentialsInTheURL: the live page behind basic_auth,
// opened as http://user:pass@host/inflight/, reads the state with the
// credentials the browser keeps (a fetch of a URL with credentials in it
// would fail) and shows the zone, with no error.
func TestLivePageWithCredentialsInTheURL(t *testing.T) {
	port := freePort(t)
	site := fmt.Sprintf("http://127.0.0.1:%d", port)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
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
	u, _ := url.Parse(site + "/inflight/")
	u.User = url.UserPassword("admin", "s3cret")
	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(u.String())); err != nil {
		t.Fatal(err)
	}
	type shown struct {
		Status string `json:"status"`
		Zone   bool   `json:"zone"`
	}
	var got shown
	deadline := time.Now().Add(within)
	for !got.Zone || strings.Contains(got.Status, "cannot") {
		if time.Now().After(deadline) {
			t.Fatalf("opened as %s, the page shows status %q and the zone: %v; want the zone and no error", u.Redacted(), got.Status, got.Zone)
		}
		time.Sleep(20 * time.Millisecond)
		got, _ = chromedp.Run(ctx, chromedp.Evaluate[shown](`({status: document.getElementById('status').textContent,
			zone: document.querySelector('[data-zone="guarded"]') !== null})`)) // an error (the page loading): asked again
	}
}
