"""The browser tool on a legacy-style app (legacy_app.py), for real: chromium in a gVisor
sandbox from the browser image, reached through the egress proxy, inside a network namespace
of its own (browser_probe.py). Every action is checked by what the app's server received, not
by what the tool said; refusals by the egress ledger; quietness by the whole ledger.

One sandbox (one browser) serves the whole scenario, as in a run: the session, tabs and
cookies carry from call to call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from netns_probe_run import run_probe  # tests/netns_probe_run.py

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("browser_image")]

PROBE = Path(__file__).with_name("browser_probe.py")
APP = "http://legacy.test"


def ref(role: str, name: str) -> dict[str, list[str]]:
    return {"$ref": [role, name]}


STEPS: list[dict[str, Any]] = [
    # 0-3: log in; the heading "Please log in" must not be taken for the button "Log in"
    {"action": "open", "url": f"{APP}/"},
    {"action": "fill", "ref": ref("textbox", "User name"), "value": "clerk"},
    {"action": "fill", "role": "textbox", "name": "Password", "value": "s3cret"},
    {"action": "click", "role": "button", "name": "Log in"},
    # 4-6: search by pressing Enter; read the table as rows; read one cell
    {"action": "press", "role": "textbox", "name": "Search", "key": "Enter"},
    {"action": "fill", "role": "textbox", "name": "Search", "value": "acme"},
    {"action": "press", "key": "Enter"},
    {"action": "read", "format": "rows"},
    {"action": "read", "selector": "#invoices tbody tr:first-child td:nth-child(3)"},
    # 9-22: the detail form, every field type, saved as multipart
    {"put": ["in/receipt.txt", "receipt for invoice 7\n"]},
    {"action": "click", "role": "link", "name": "7"},
    {"action": "fill", "role": "spinbutton", "name": "Amount", "value": "130.25"},
    {"action": "fill", "role": "textbox", "name": "Due date", "value": "2024-06-30"},
    {"action": "fill", "selector": "#email", "value": "billing@acme.example"},
    {"action": "select", "role": "combobox", "name": "Status", "options": ["Paid"]},
    {"action": "select", "role": "listbox", "name": "Tags", "options": ["urgent", "Q3"]},
    {"action": "fill", "role": "textbox", "name": "Notes", "value": "paid by wire\nref 42"},
    {"action": "check", "role": "checkbox", "name": "Approved"},
    {"action": "uncheck", "role": "checkbox", "name": "Send reminder"},
    {"action": "check", "role": "radio", "name": "High"},
    {"action": "upload", "selector": "#attachment", "files": ["in/receipt.txt"]},
    {"action": "type", "role": "textbox", "name": "Customer code", "text": "Acm"},
    {"action": "click", "role": "button", "name": "Save"},
    # 23-26: confirm(): dismissed by this call, then answered by the model (default: ask)
    {"action": "back"},
    {"action": "click", "role": "button", "name": "Delete invoice", "dialog": "dismiss"},
    {"action": "click", "role": "button", "name": "Delete invoice"},
    {"action": "dialog", "accept": True},
    # 27-31: a new tab whose page pulls from hosts outside the policy; tabs; close it
    {"action": "open", "url": f"{APP}/invoices"},
    {"action": "click", "role": "link", "name": "Quarterly report"},
    {"action": "tabs"},
    {"action": "switch_tab", "tab": "t1"},
    {"action": "close_tab", "tab": "t2"},
    # 32-33: the CSV export, by a click
    {"action": "download", "role": "link", "name": "Export CSV"},
    {"shell": "cd /workspace/downloads && echo * && cat invoices.csv"},
    # 34: hover opens a menu; its link is then clickable
    {"action": "hover", "selector": "#menu"},
    {"action": "click", "role": "link", "name": "Archive paid invoices"},
    # 36-39: a frameset: read, and click inside a frame by role and frame name
    {"action": "open", "url": f"{APP}/frames"},
    {"action": "read"},
    {"action": "click", "role": "button", "name": "Confirm balance", "frame": "main"},
    {"action": "click", "ref": ref("link", "Statements")},
    # 40-42: an iframe's form, addressed by refs from the snapshot
    {"action": "open", "url": f"{APP}/inbox"},
    {"action": "fill", "ref": ref("textbox", "Reply"), "value": "sent again today"},
    {"action": "click", "ref": ref("button", "Send reply")},
    # 43-46: JS-rendered content: not there yet, then waited for, then used
    {"action": "open", "url": f"{APP}/board"},
    {"action": "click", "role": "button", "name": "Approve all", "timeout": 0.5},
    {"action": "wait_for", "role": "button", "name": "Approve all", "timeout": 10},
    {"action": "click", "role": "button", "name": "Approve all"},
    # 47-48: scrolling loads more
    {"action": "open", "url": f"{APP}/long"},
    {"action": "scroll", "direction": "down", "amount": 100000},
    # 49-52: a missing element fails within its timeout; several matches are an error
    {"action": "click", "selector": "#no-such-button", "timeout": 2},
    {"action": "click", "role": "listitem"},
    {"action": "screenshot"},
    {"action": "screenshot", "full_page": True},
    # 53-55: policy refusals of navigations, HTTP and HTTPS
    {"action": "open", "url": "http://blocked.test/secret"},
    {"action": "open", "url": "https://blocked.test/secret"},
    {"action": "open", "url": f"{APP}/invoices"},
    # 56-57: one driver, one chromium, kept for the whole session; then idle for stray traffic
    {"shell": "ps -eo args | grep -c '[b]rowser_server'; ps -eo args | grep -v -- --type= "
              "| grep -c '^[/]usr/lib/chromium/chromium .*--remote-debugging-port'"},
    {"sleep": 20},
    # 58-61: an element's screenshot; text waited for until it appears, and until it is gone
    {"action": "screenshot", "selector": "#invoices"},
    {"action": "open", "url": f"{APP}/board"},
    {"action": "wait_for", "text": "invoices waiting for approval", "timeout": 10},
    {"action": "wait_for", "text": "Loading…", "state": "hidden", "timeout": 10},
    # 62-63: prompt(): answered with text by this call, then cancelled
    {"action": "open", "url": f"{APP}/invoices"},
    {"action": "click", "role": "button", "name": "Add note", "dialog": "accept",
     "prompt_text": "call back Monday"},
    {"action": "click", "role": "button", "name": "Add note", "dialog": "dismiss"},
]  # fmt: skip


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    spec = {"browser": {"images": True, "image_max_bytes": "200kB"}, "steps": STEPS}
    home = tmp_path_factory.mktemp("browser") / "home"
    return run_probe(PROBE, home, [json.dumps(spec)], timeout=580)


def _step(session: dict[str, Any], n: int) -> dict[str, Any]:
    return session["steps"][n]


def _posts(session: dict[str, Any], path: str) -> list[dict[str, Any]]:
    return [r for r in session["received"] if r["path"] == path and r["method"] == "POST"]


def test_login_by_ref_and_exact_role_name_and_the_session_is_kept(session) -> None:
    opened = _step(session, 0)
    assert opened["ok"] and "http status: 200" in opened["text"]
    assert 'heading "Please log in"' in opened["text"] and "[ref=e" in opened["text"]
    assert _posts(session, "/login")[0]["form"] == {"user": ["clerk"], "password": ["s3cret"]}
    assert "Signed in as clerk" in _step(session, 3)["text"]
    later = [r for r in session["received"] if r["path"] == "/invoice" and r["method"] == "GET"]
    assert later and all(r["signed_in"] for r in later)


def test_enter_submits_the_search_and_tables_read_as_rows(session) -> None:
    searches = [r["query"] for r in session["received"] if r["path"] == "/invoices"]
    assert {"q": ["acme"]} in searches
    rows = _step(session, 7)["text"]
    assert "table 1 'Open items': 3 rows" in rows
    assert '["7", "Acme Corp", "120.00", "open"]' in rows and "Globex" not in rows
    assert "text:\n120.00" in _step(session, 8)["text"]


def test_every_field_type_reaches_the_server(session) -> None:
    (saved,) = _posts(session, "/invoice/7")
    form = saved["form"]
    assert form["amount"] == ["130.25"] and form["due"] == ["2024-06-30"]
    assert form["email"] == ["billing@acme.example"] and form["status"] == ["paid"]
    assert form["tags"] == ["urgent", "q3"] and form["notes"] == ["paid by wire\r\nref 42"]
    assert form["approved"] == ["yes"] and "reminder" not in form
    assert form["priority"] == ["high"] and form["customer"] == ["Acme Corp"]
    assert form["code"] == ["Acm"] and form["csrf"]
    assert saved["files"]["attachment"] == ["receipt.txt", "receipt for invoice 7\n"]
    assert "value now: 'Paid'" in _step(session, 14)["text"]
    assert "not checked" in _step(session, 18)["text"]
    assert "uploaded: receipt.txt" in _step(session, 20)["text"]


def test_typing_sends_each_key(session) -> None:
    typed = [r["query"]["q"][0] for r in session["received"] if r["path"] == "/api/suggest"]
    assert typed == ["A", "Ac", "Acm"]
    assert "Acme Corp" in _step(session, 21)["text"]  # the suggestions it rendered


def test_a_prompt_gets_the_text_the_call_gave(session) -> None:
    notes = [r["query"] for r in session["received"] if r["path"] == "/api/note"]
    assert notes == [{"text": ["call back Monday"]}]  # the dismissed one sent nothing
    answered = _step(session, 63)["text"]
    assert "dialog (prompt) on tab t1: 'Note for this list?'" in answered
    assert "accepted with 'call back Monday' (this call)" in answered


def test_back_loads_the_earlier_page_again(session) -> None:
    back = _step(session, 23)
    assert back["ok"] and "tab t1: http://legacy.test/invoice?id=7" in back["text"]
    views = [r for r in session["received"] if r["path"] == "/invoice" and r["method"] == "GET"]
    assert len(views) == 2  # no-store: the browser asked the app again


def test_confirm_is_dismissed_or_put_to_the_model(session) -> None:
    dismissed = _step(session, 24)["text"]
    assert "'Delete invoice 7? This cannot be undone.'" in dismissed
    assert "dismissed (this call)" in dismissed
    asked = _step(session, 25)
    assert "a confirm dialog is open" in asked["text"] and "action dialog" in asked["text"]
    assert "accepted (the model)" in _step(session, 26)["text"]
    assert "Invoice 7 deleted" in _step(session, 26)["text"]
    assert len(_posts(session, "/invoice/7/delete")) == 1  # only the accepted one


def test_a_new_tab_is_reported_and_its_blocked_requests_listed(session) -> None:
    opened = _step(session, 28)["text"]
    assert "new tab t2 opened: http://legacy.test/report (now the current tab)" in opened
    assert "Total invoiced this quarter: 300.00" in opened
    assert "blocked by the egress policy:" in opened
    assert "- tracker.test:80 (rule: default: block)" in opened
    assert "- cdn.blocked.test:443 (rule: default: block)" in opened
    assert any(r["path"] == "/report" for r in session["received"])
    listed = _step(session, 29)["text"]
    assert "- t1: http://legacy.test/invoices" in listed and "- t2 (current)" in listed
    assert "tab t2 closed" in _step(session, 31)["text"]


def test_a_download_is_saved_in_workspace_downloads_and_reported(session) -> None:
    text = _step(session, 32)["text"]
    assert "downloaded /workspace/downloads/invoices.csv (" in text and "text/csv)" in text
    assert _step(session, 32)["detail"]["downloads"][0]["path"] == "downloads/invoices.csv"
    listing = _step(session, 33)["stdout"]
    assert listing.splitlines()[0] == "invoices.csv" and "7,Acme Corp,120.00,open" in listing


def test_hover_shows_a_menu_whose_link_then_works(session) -> None:
    archived = [r["query"] for r in session["received"] if r["path"] == "/archive"]
    assert archived == [{"status": ["paid"]}]


def test_frames_are_read_and_addressed(session) -> None:
    text = _step(session, 37)["text"]
    assert "--- frame 'main' (http://legacy.test/frames/balance) ---" in text
    assert "Account balance: 1234.56 EUR" in text and "Statements" in text
    assert len(_posts(session, "/frames/confirm")) == 1
    assert "March statement: 3 items" in _step(session, 39)["text"]
    assert _posts(session, "/inbox/reply")[0]["form"] == {"reply": ["sent again today"]}


def test_waiting_for_js_rendered_content(session) -> None:
    early = _step(session, 44)
    assert not early["ok"] and "no element matches role button named 'Approve all'" in early["text"]
    assert "waited" in _step(session, 45)["text"]
    assert "3 invoices approved" in _step(session, 46)["text"]
    assert len(_posts(session, "/api/approve")) == 1


def test_scrolling_loads_more(session) -> None:
    assert any(r["path"] == "/api/more" for r in session["received"])
    assert "All items loaded" in _step(session, 48)["text"]


def test_a_missing_element_fails_within_its_timeout_and_nothing_is_matched_loosely(session):
    missing = _step(session, 49)
    assert not missing["ok"]
    assert "no element matches selector '#no-such-button' (waited 2.0 s)" in missing["text"]
    assert missing["seconds"] < 4
    several = _step(session, 50)
    assert not several["ok"] and "elements match role listitem" in several["text"]


def test_screenshots_are_png_and_reach_the_model_within_its_budget(session) -> None:
    shot, full, element = _step(session, 51), _step(session, 52), _step(session, 58)
    assert shot["screenshot_png"] and "screenshot taken (1280x" in shot["text"]
    assert shot["model_image"] in ("image/png", "image/jpeg")
    assert full["screenshot_png"] and full["screenshot_bytes"] > 0
    assert element["screenshot_png"] and element["screenshot_bytes"] < shot["screenshot_bytes"]


def test_waiting_for_text_to_appear_and_to_go(session) -> None:
    appeared, gone = _step(session, 60), _step(session, 61)
    assert appeared["ok"] and "3 invoices waiting for approval" in appeared["text"]
    assert gone["ok"] and "waited" in gone["text"]


def test_navigations_refused_by_policy_say_so_for_http_and_https(session) -> None:
    for n in (53, 54):
        step = _step(session, n)
        assert not step["ok"]
        assert (
            f"error: refused by the egress policy: {step['args']['url']} was not loaded"
            in step["text"]
        )
        assert "(rule: default: block;" in step["text"]
        assert step["detail"]["refused"]["rule"] == "default: block"
    assert _step(session, 55)["ok"]


def test_one_driver_and_one_chromium_serve_the_whole_session(session) -> None:
    assert _step(session, 56)["stdout"].split() == ["1", "1"]
    assert sum("browser_started" in json.dumps(s.get("detail", {})) for s in session["steps"]) == 0


def test_chromium_makes_no_request_the_script_did_not_cause(session) -> None:
    hosts = {(e["host"], e["port"]) for e in session["ledger"]}
    assert hosts == {
        ("legacy.test", 80),
        ("tracker.test", 80),
        ("cdn.blocked.test", 443),
        ("blocked.test", 80),
        ("blocked.test", 443),
    }


async def test_a_sandbox_without_a_browser_says_so(settings, base_image) -> None:
    from aamp.agents.sandbox_tools import SandboxTools
    from aamp.sandbox.gvisor import GVisorDriver
    from aamp.sandbox.images import ImageStore
    from aamp.sandbox.manager import CreateRequest, SandboxManager

    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    try:
        sandbox = await manager.create(CreateRequest(image="base"))
        tools = SandboxTools(lambda: manager.use(sandbox.id), {}, 30)
        observation = await tools.run("browser", {"action": "open", "url": "http://x.test/"})
    finally:
        await manager.shutdown()
    assert not observation.ok
    assert "this sandbox's image has no browser" in observation.text
    assert "image: browser" in observation.text
