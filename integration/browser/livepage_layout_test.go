package browser

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestLivePageFitsAt1280: in a window 1280 px wide, every column header of
// a zone with all its columns (units, waits per key, shares, every refusal
// reason) shows: inside the window, its text within its cell, and not
// covered by another element (a chart beside its table).
func TestLivePageFitsAt1280(t *testing.T) {
	b := newBackend(t)
	site := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	loadWithPage(t, site, `limit tenant {header.X-Tenant} 4
total 6
cost {header.X-Cost}
zone widest
wait 30s
max_waiting 3
fair tenant
weight 2
metrics per_key plain`, b.addr)
	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 1000), chromedp.Navigate(site+"/inflight/")); err != nil {
		t.Fatal(err)
	}
	shows := func(field, want string) {
		t.Helper()
		js := fmt.Sprintf(`(() => { const e = document.querySelector('[data-zone="widest"] [data-field=%q]'); return e ? e.textContent : '' })()`, field)
		eventually(t, within, "the page shows "+field+" "+want, func() bool {
			got, _ := chromedp.Run(ctx, chromedp.Evaluate[string](js)) // an error (the page loading): asked again
			return got == want
		})
	}

	// A request of a and of b gives each a share; then tenant a fills its
	// limit with 2 requests of 2 units, b the total with one more; b waits
	// three times, c is refused (queue_full), and one of b's waiters
	// leaves, so that b's waits show.
	for _, tenant := range []string{"a", "b"} {
		if status := <-send(site+"/", "X-Tenant", tenant, "X-Cost", "2"); status != http.StatusOK {
			t.Fatalf("a request of %s: status %d, want 200", tenant, status)
		}
	}
	var ends []<-chan int
	for _, tenant := range []string{"a", "a", "b"} {
		ends = append(ends, send(site+"/hold", "X-Tenant", tenant, "X-Cost", "2"))
	}
	eventually(t, within, "the backend holds 3 requests", func() bool { return b.cur.Load() == 3 })
	for range 2 {
		ends = append(ends, send(site+"/hold", "X-Tenant", "b", "X-Cost", "2"))
	}
	waiter, leave := context.WithCancel(context.Background())
	left := sendCtx(waiter, site+"/hold", "X-Tenant", "b", "X-Cost", "2")
	shows("waiting", "3")
	if status := <-send(site+"/hold", "X-Tenant", "c", "X-Cost", "1"); status != http.StatusTooManyRequests {
		t.Fatalf("a request beyond max_waiting: status %d, want 429", status)
	}
	leave()
	<-left

	// Each header that does not show, and why; the wide tables (units,
	// waits and shares per key) must be there for the check to mean
	// anything.
	const check = `(() => {
		const zone = document.querySelector('[data-zone="widest"]');
		if (!zone) return ['no zone yet'];
		const heads = [...zone.querySelectorAll('th')];
		const texts = heads.map((th) => th.textContent);
		for (const want of ['units', 'dry_run', 'wait p99', 'share (1–2 min)']) {
			if (!texts.includes(want)) return ['no ' + want + ' column yet'];
		}
		const bad = [];
		for (const th of heads) {
			const r = th.getBoundingClientRect();
			const why = [];
			if (r.left < 0 || r.right > window.innerWidth || r.top < 0 || r.bottom > window.innerHeight) why.push('outside the window');
			if (th.scrollWidth > th.clientWidth) why.push('text wider than its cell');
			for (const x of [r.left + 1, (r.left + r.right) / 2, r.right - 1]) {
				const top = document.elementFromPoint(x, (r.top + r.bottom) / 2);
				if (top && !th.contains(top)) { why.push('covered by ' + top.tagName.toLowerCase() + (top.className.baseVal !== undefined ? '.' + top.className.baseVal : top.className ? '.' + top.className : '')); break; }
			}
			if (why.length) bad.push(th.textContent + ': ' + why.join(', '));
		}
		return bad;
	})()`
	var bad []string
	deadline := time.Now().Add(within)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](check))
		if err == nil { // else the page is loading: asked again
			bad = got
		}
		if err == nil && (len(bad) == 0 || !strings.HasPrefix(bad[0], "no ")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for the zone's columns: %q", within, bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(bad) > 0 {
		t.Errorf("at 1280 px, column headers that do not show:\n%s", strings.Join(bad, "\n"))
	}
	b.open()
	for _, end := range ends {
		if status := <-end; status != http.StatusOK {
			t.Errorf("a held request ended with %d, want 200", status)
		}
	}
}
