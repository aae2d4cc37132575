package webtest

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/rolter-ai/rolter/config"
)

// TestDashboardLimits drives the limits on the Keys page: a key made with limits through the form (a
// refused one first, its error beside its field) shows them in its row and has them in the API; a key's
// per-model limits are shown; a key's limits edited in its row to all blank are null, "org default"; the
// superadmin sets the org's own limits and its keys' default (a refused field beside it) and sees them; an
// org admin (a token made through the API) sees the org's limits without their form, and edits a key's
// (a key's per-model limits kept).
func TestDashboardLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test is not short")
	}
	e := newEnv(t)
	r := e.su("POST", "/api/v1/orgs", map[string]string{"name": "acme"})
	want(t, r, 201, "")
	var org orgView
	r.json(t, &org)
	keysAPI := "/api/v1/orgs/" + org.ID + "/keys"
	want(t, e.su("POST", keysAPI, map[string]any{"name": "modeled", "limits": map[string]any{"models": map[string]any{"m": map[string]any{"tpm": 50000}}}}), 201, "")
	type keyView struct {
		ID     string         `json:"id"`
		Name   string         `json:"name"`
		Limits *config.Limits `json:"limits"`
	}
	readKey := func(name string) keyView {
		t.Helper()
		var keys list[keyView]
		r := e.su("GET", keysAPI, nil)
		want(t, r, 200, "")
		r.json(t, &keys)
		for _, k := range keys.Data {
			if k.Name == name {
				return k
			}
		}
		t.Fatalf("the API has no key %q: %+v", name, keys.Data)
		return keyView{}
	}
	// cell is the text of the Limits cell of the key named name.
	cell := func(name string) string {
		return `[...document.querySelectorAll("#keys-list tbody tr")].find((r) => r.cells[0].textContent === ` + strconv.Quote(name) + `)?.cells[5].textContent`
	}
	text := func(id string) string { return `document.getElementById(` + strconv.Quote(id) + `)?.textContent` }

	p := newTab(t, e.api.base)
	p.do("open Keys", chromedp.Navigate(p.origin+"/dashboard/#/keys"))
	p.wait("the sign-in form", `document.activeElement?.id === "token"`)
	p.do("sign in", chromedp.SendKeys(chromedp.ID("token"), rootToken), chromedp.KeyEvent(kb.Enter))
	p.wait("the keys and the org's limits, with their form", cell("modeled")+` === "m: 50k tpm" && `+text("org-limits-own")+` === "rolter.toml's default" && `+
		text("org-limits-keys")+` === "rolter.toml's default" && document.getElementById("ol-save")`)

	// A key with limits, through the form: a refused limit first.
	p.do("a key with a negative rpm", chromedp.SendKeys(chromedp.ID("k-name"), "lim"), chromedp.SendKeys(chromedp.ID("k-limits-rpm"), "-1"),
		chromedp.SendKeys(chromedp.ID("k-limits-tpm"), "200000"), chromedp.SendKeys(chromedp.ID("k-limits-concurrent"), "32"), chromedp.KeyEvent(kb.Enter))
	p.wait("the error beside rpm, focused", `!document.getElementById("k-limits-rpm-error").hidden && `+text("k-limits-rpm-error")+`.includes("-1 is not between 0") && `+
		`document.activeElement?.id === "k-limits-rpm" && !document.getElementById("k-errors").hidden`)
	p.do("rpm 600", retype(chromedp.ID("k-limits-rpm"), "600"), chromedp.KeyEvent(kb.Enter))
	p.wait("the key, its limits in its row", `document.getElementById("key-secret-value")?.value.startsWith("rk-") && `+cell("lim")+` === "600 rpm · 200k tpm · 32 in flight" && `+
		`document.getElementById("k-limits-rpm").value === "" && document.getElementById("k-limits-rpm-error").hidden`)
	k := readKey("lim")
	if want := (&config.Limits{RPM: 600, TPM: 200000, Concurrent: 32}); !reflect.DeepEqual(k.Limits, want) {
		t.Fatalf("the API has the key's limits %+v, want %+v", k.Limits, want)
	}

	// Its limits edited in its row, all blank: none of its own.
	field := func(path string) chromedp.ID { return chromedp.ID("kl-" + k.ID + "-limits-" + path) }
	p.do("edit the key's limits", chromedp.Click(chromedp.ID("kl-edit-"+k.ID)))
	p.wait("its form, filled", `document.activeElement?.id === "kl-`+k.ID+`-limits-rpm" && document.activeElement.value === "600"`)
	p.do("empty them", retype(field("rpm"), ""), retype(field("tpm"), ""), retype(field("concurrent"), ""), chromedp.KeyEvent(kb.Enter))
	p.wait("org default", cell("lim")+` === "org default" && `+text("keys-status")+` === "Limits of key lim saved." && document.activeElement?.id === "kl-edit-`+k.ID+`"`)
	if k := readKey("lim"); k.Limits != nil {
		t.Fatalf("the API has the key's limits %+v, want null", k.Limits)
	}

	// The org's limits, as the superadmin: a refused field, then saved.
	p.do("open the org's limits", chromedp.Click(chromedp.CSS("#org-limits-edit summary")))
	p.do("limits with a word for a number", chromedp.SendKeys(chromedp.ID("ol-limits-rpm"), "6000"), chromedp.SendKeys(chromedp.ID("ol-limits-tpm"), "2000000"),
		chromedp.SendKeys(chromedp.ID("ol-key_limits-rpm"), "sixty"), chromedp.Click(chromedp.ID("ol-save")))
	p.wait("the error beside the key default's rpm", text("ol-key_limits-rpm-error")+`.includes("must be an integer") && document.activeElement?.id === "ol-key_limits-rpm"`)
	p.do("rpm 60", retype(chromedp.ID("ol-key_limits-rpm"), "60"), chromedp.Click(chromedp.ID("ol-save")))
	p.wait("the org's limits shown", text("org-limits-own")+` === "6k rpm · 2M tpm" && `+text("org-limits-keys")+` === "60 rpm" && `+
		text("ol-status")+` === "The org's limits are saved." && document.getElementById("ol-errors").hidden`)
	var ol struct {
		Limits    *config.Limits `json:"limits"`
		KeyLimits *config.Limits `json:"key_limits"`
	}
	r = e.su("GET", "/api/v1/orgs/"+org.ID+"/limits", nil)
	want(t, r, 200, "")
	r.json(t, &ol)
	if !reflect.DeepEqual(ol.Limits, &config.Limits{RPM: 6000, TPM: 2000000}) || !reflect.DeepEqual(ol.KeyLimits, &config.Limits{RPM: 60}) {
		t.Fatalf("the API has the org's limits %+v and key limits %+v", ol.Limits, ol.KeyLimits)
	}
	p.shot("limits")

	// An org admin: the org's limits shown, not editable; a key's limits edited.
	r = e.su("POST", "/api/v1/orgs/"+org.ID+"/tokens", map[string]string{"name": "admin"})
	want(t, r, 201, "")
	var tok struct{ Secret string }
	r.json(t, &tok)
	p.do("sign out", chromedp.Click(chromedp.ID("logout")))
	p.wait("the sign-in form", `document.activeElement?.id === "token" && !document.getElementById("login").hidden`)
	p.do("sign in as the org admin", chromedp.SendKeys(chromedp.ID("token"), tok.Secret), chromedp.KeyEvent(kb.Enter))
	p.wait("the org's limits, with no form", `document.getElementById("whoami").textContent.startsWith("admin of") && `+text("org-limits-own")+` === "6k rpm · 2M tpm" && `+
		text("org-limits-keys")+` === "60 rpm" && document.getElementById("org-limits-who") && !document.querySelector("#org-limits input, #org-limits button, #ol-save") && `+cell("lim")+` === "org default"`)
	p.do("edit the key's limits", chromedp.Click(chromedp.ID("kl-edit-"+k.ID)))
	p.wait("its form, empty", `document.activeElement?.id === "kl-`+k.ID+`-limits-rpm" && document.activeElement.value === ""`)
	p.shot("key-limits")
	p.do("rpm 5", chromedp.SendKeys(field("rpm"), "5"), chromedp.KeyEvent(kb.Enter))
	p.wait("5 rpm", cell("lim")+` === "5 rpm"`)
	if k := readKey("lim"); !reflect.DeepEqual(k.Limits, &config.Limits{RPM: 5}) {
		t.Fatalf("the API has the key's limits %+v, want rpm 5", k.Limits)
	}
	// A key's per-model limits are kept, ticked, when its own are edited.
	m := readKey("modeled")
	p.do("edit the per-model key's limits", chromedp.Click(chromedp.ID("kl-edit-"+m.ID)))
	p.wait("its form, its per-model limits kept", `document.activeElement?.id === "kl-`+m.ID+`-limits-rpm" && document.getElementById("kl-`+m.ID+`-limits-rpm").closest("form").querySelector('input[type="checkbox"]')?.checked`)
	p.do("rpm 10", chromedp.SendKeys(chromedp.ID("kl-"+m.ID+"-limits-rpm"), "10"), chromedp.KeyEvent(kb.Enter))
	p.wait("10 rpm and the model's", cell("modeled")+` === "10 rpm; m: 50k tpm"`)
	if m := readKey("modeled"); !reflect.DeepEqual(m.Limits, &config.Limits{RPM: 10, Models: map[string]config.ModelLimits{"m": {TPM: 50000}}}) {
		t.Fatalf("the API has the key's limits %+v", m.Limits)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.problems {
		t.Errorf("the page: %s", m)
	}
}
