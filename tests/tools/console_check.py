"""Drive the operator console in headless Chromium (Debian's chromium and
chromedriver, through selenium) and check what a reader and an admin see.

Run by tests/integration/console.rs with one argument, a JSON file:
  {"base": "http://127.0.0.1:PORT", "backend": "...", "workspace": "...",
   "admin": ["user", "password"], "reader": ["user", "password"],
   "serial": N, "from_version": "id", "changed": "terraform_data.b",
   "holder": "alice@laptop", "screenshots": "/path/to/dir"}
Prints one line per check; exits 1 with the reason on the first failure.
"""

import http.server
import json
import sys
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

CONFIG = json.loads(Path(sys.argv[1]).read_text())
BASE = CONFIG["base"]
SHOTS = Path(CONFIG["screenshots"])
SHOTS.mkdir(parents=True, exist_ok=True)
# How long any page may take to load or change: generous, since the whole
# suite (and Chromium starting) may share two cores with this script.
DEADLINE = 60


def fail(reason):
    print(f"FAIL {reason}", flush=True)
    sys.exit(1)


STARTED = time.monotonic()


def check(condition, reason):
    if not condition:
        fail(reason)
    # The time since start shows which step a slow run spent its time on.
    print(f"ok   {time.monotonic() - STARTED:5.1f}s  {reason}", flush=True)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--window-size=1400,900"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def body_text(driver):
    """The page's text ("" while it has none); never raises, as failure
    messages use it whatever state the page is in."""
    try:
        bodies = driver.find_elements(By.TAG_NAME, "body")
        return bodies[0].text if bodies else ""
    except WebDriverException as e:
        return f"(no page text: {e.__class__.__name__})"


def wait_for(driver, condition, what):
    """Poll `condition` until it holds, or fail naming `what` and the page."""
    try:
        return WebDriverWait(driver, DEADLINE).until(condition)
    except TimeoutException:
        fail(f"{what}: not within {DEADLINE} s; at {driver.current_url}: {body_text(driver)!r}")


def loaded(driver, locator, what):
    """Wait until the current page has loaded whole and holds `locator`;
    that element."""
    wait_for(driver, page_complete, f"{what} (page still loading)")
    return wait_for(driver, EC.presence_of_element_located(locator), what)


def page_complete(driver):
    """True once the current page has loaded whole; an error from a page
    between loads means "not yet"."""
    try:
        return driver.execute_script("return document.readyState") == "complete"
    except WebDriverException:
        return False


def old_page_gone(driver):
    """True once the page marked by `click_then` has been replaced. Asked
    mid-navigation, the browser may answer with any WebDriverException (not
    only StaleElementReference: Chrome 156 says "Node with given id does
    not belong to the document"), which means only "not yet"."""
    try:
        return driver.execute_script("return window.__wasmstate_old_page !== true")
    except WebDriverException:
        return False


def click_then(driver, element, locator, what):
    """Click `element`, which loads another page, and return `locator` on
    that page: a click returns before the page has loaded, so mark the old
    page's window (a new page has a new window object), wait until the mark
    is gone, then until the new page has loaded with `locator`. No element
    of the old page is asked anything after the click."""
    driver.execute_script("window.__wasmstate_old_page = true")
    element.click()
    wait_for(driver, old_page_gone, f"{what} (the old page stayed)")
    return loaded(driver, locator, what)


def open_page(driver, url, locator, what):
    """Load `url` and return `locator` on it, once the page has it: checks
    that something is absent mean nothing on a page that is not there."""
    driver.get(url)
    return loaded(driver, locator, what)


def sign_in(driver, user, password, login=None):
    login = login or f"{BASE}/ui/login"
    button = open_page(driver, login, (By.ID, "sign-in"), "the login form")
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    # A refused sign-in shows the login form again: the wait's failure says so.
    click_then(driver, button, (By.ID, "backends"), f"{user}'s backends page after signing in")
    wait_for(driver, lambda d: d.current_url.endswith("/ui/backends"),
             f"{user} lands on the backends page after signing in")
    check(True, f"{user} signs in and lands on the backends page")


def shot(driver, name):
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"shot {path}", flush=True)


def texts(driver, selector):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def attacker_page(target):
    """A page on another origin whose form posts to `target` without the
    CSRF token, as a hostile site would; served on a free port."""
    page = f"""<!doctype html><form id="forge" method="post" action="{target}">
<input type="hidden" name="csrf" value="guessed"><button id="go" type="submit">win a prize</button></form>"""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    # Port 0, then read back the port it bound: choosing a free port and
    # binding it later would leave a moment for another process to take it.
    # Threaded: Chrome opens speculative connections it may never send a
    # request on, and a one-at-a-time server blocks reading one until
    # Chrome drops it (a minute), which held up `shutdown`.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}/", server


backend, workspace = CONFIG["backend"], CONFIG["workspace"]
row = f'tr[data-workspace="{workspace}"]'
workspaces_page = f"{BASE}/ui/backends/{backend}"
versions_page = f"{BASE}/ui/backends/{backend}/{workspace}"
diff_page = f"{versions_page}?from={CONFIG['from_version']}&to=current"

# A reader: sees states, the lock's holder, no admin buttons.
reader = browser()
try:
    # A deep link opened without a session (pasted in a chat): the login
    # form, then back to the page it named.
    button = open_page(reader, workspaces_page, (By.ID, "sign-in"), "the login form a deep link leads to")
    reader.find_element(By.ID, "user").send_keys(CONFIG["reader"][0])
    reader.find_element(By.ID, "password").send_keys(CONFIG["reader"][1])
    click_then(reader, button, (By.CSS_SELECTOR, row), "the deep-linked page after signing in")
    check(reader.current_url == workspaces_page,
          f"a deep link lands on its own page after signing in ({reader.current_url})")
    shot(reader, "deep-link")
    open_page(reader, f"{BASE}/ui/backends", (By.ID, "backends"), "the backends page")
    shot(reader, "backends")
    check(backend in texts(reader, "#backends td a"), "the backends page lists the backend")
    check("local (embedded)" not in reader.page_source, "a reader is not shown what a backend is made of")
    open_page(reader, workspaces_page, (By.CSS_SELECTOR, row), "the workspace's row")
    shot(reader, "workspaces-reader")
    serial = reader.find_element(By.CSS_SELECTOR, f"{row} td.serial").text
    check(serial == str(CONFIG["serial"]), f"the workspace shows serial {CONFIG['serial']} (shown: {serial!r})")
    holder = reader.find_element(By.CSS_SELECTOR, f"{row} td.lock").text
    check(CONFIG["holder"] in holder, f"the lock's holder is shown ({holder!r})")
    check(" · held " in holder, f"the lock's age is shown ({holder!r})")
    check(not reader.find_elements(By.CSS_SELECTOR, "button.force-unlock"), "a reader sees no force-unlock button")
    open_page(reader, versions_page, (By.ID, "versions"), "the versions table")
    check(not reader.find_elements(By.CSS_SELECTOR, "button.restore"), "a reader sees no restore button")
finally:
    reader.quit()

admin = browser()
try:
    # A login link naming another site as where to go next: the console's
    # own backends page instead (sign_in waits for it).
    sign_in(admin, *CONFIG["admin"], login=f"{BASE}/ui/login?next=//evil.example/ui/x")
    check(True, "a next= naming another site is ignored")
    open_page(admin, f"{BASE}/ui/guests", (By.ID, "guests"), "the guests table")
    shot(admin, "guests")
    check("local (embedded)" in admin.page_source, "the guests page shows an admin the guest")
    # The diff between the first apply's version and the current state.
    open_page(admin, diff_page, (By.ID, "diff"), "the diff")
    shot(admin, "diff")
    changed = texts(admin, "#changed li")
    check(changed == [CONFIG["changed"]], f"the diff shows exactly {CONFIG['changed']} changed (shown: {changed})")
    check(not admin.find_elements(By.CSS_SELECTOR, "#added li, #removed li"), "nothing shown as added or removed")
    check(admin.find_elements(By.CSS_SELECTOR, "button.restore"), "an admin sees restore buttons")

    # A forged admin POST from another origin, without the token.
    target = f"{BASE}/ui/backends/{backend}/{workspace}/force-unlock"
    url, server = attacker_page(target)
    go = open_page(admin, url, (By.ID, "go"), "the attacker's page")
    click_then(admin, go, (By.TAG_NAME, "body"), "the forged POST's answer")
    refused = body_text(admin)
    shot(admin, "forged-post")
    check("may not change anything" in refused or "nothing was changed" in refused,
          f"the forged POST is refused ({refused!r})")
    server.shutdown()
    server.server_close()
    open_page(admin, workspaces_page, (By.CSS_SELECTOR, row), "the workspace's row")
    holder = admin.find_element(By.CSS_SELECTOR, f"{row} td.lock").text
    check(CONFIG["holder"] in holder, "the lock is still held after the forged POST")

    # At 1280 px the lock's text and the force-unlock button sit apart.
    admin.set_window_size(1280, 900)
    open_page(admin, workspaces_page, (By.CSS_SELECTOR, row), "the workspace's row at 1280 px")
    apart, inside, rects = admin.execute_script("""
        const cell = document.querySelector(arguments[0] + ' td.lock');
        const text = cell.querySelector('.lock-text').getBoundingClientRect();
        const button = cell.querySelector('button.force-unlock').getBoundingClientRect();
        const box = cell.getBoundingClientRect();
        const apart = text.right <= button.left || button.right <= text.left
            || text.bottom <= button.top || button.bottom <= text.top;
        const inside = [text, button].every(r => r.left >= box.left - 0.5 && r.right <= box.right + 0.5
            && r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5);
        return [apart, inside, JSON.stringify({text, button, cell: box})];
    """, row)
    shot(admin, "workspaces-1280")
    check(apart and inside, f"at 1280 px the lock text and the force-unlock button do not overlap ({rects})")
    admin.set_window_size(1400, 900)

    # The admin's own force-unlock, from the page.
    shot(admin, "workspaces-admin")
    message = click_then(admin, admin.find_element(By.CSS_SELECTOR, f"{row} button.force-unlock"),
                         (By.ID, "message"), "the force-unlock's answer").text
    shot(admin, "force-unlocked")
    check("Released the lock" in message and CONFIG["holder"] in message, f"force-unlock reports the holder ({message!r})")
    open_page(admin, workspaces_page, (By.CSS_SELECTOR, row), "the workspace's row")
    lock = admin.find_element(By.CSS_SELECTOR, f"{row} td.lock").text
    check(lock == "unlocked", f"the workspace shows unlocked ({lock!r})")

    # Restore the first apply's version: written back with the next serial.
    restore = open_page(admin, versions_page,
                        (By.CSS_SELECTOR, f'tr[data-version="{CONFIG["from_version"]}"] button.restore'),
                        "the restore button of the first apply's version")
    message = click_then(admin, restore, (By.ID, "message"), "the restore's answer").text
    restored = CONFIG["serial"] + 1
    shot(admin, "restored")
    check(f"as serial {restored}" in message, f"restore reports serial {restored} ({message!r})")
    open_page(admin, diff_page, (By.ID, "diff"), "the diff after the restore")
    check(not texts(admin, "#changed li"), "the restored state equals the first apply's, serial aside")

    # Who wrote each kept version, and the audit trail, from the pages.
    open_page(admin, versions_page, (By.ID, "versions"), "the versions after the restore")
    writers = set(texts(admin, "#versions td.by"))
    check(writers == {CONFIG["admin"][0]}, f"each version names who wrote it ({writers})")
    link = open_page(admin, workspaces_page, (By.ID, "audit-link"), "the audit trail's link")
    click_then(admin, link, (By.ID, "audit"), "the audit trail")
    shot(admin, "audit")
    ops = texts(admin, "#audit td.operation")
    check({"write", "lock", "force-unlock", "restore"} <= set(ops), f"the trail lists the changes ({ops})")
    callers = texts(admin, "#audit tr[data-operation=force-unlock] td.caller")
    check(callers and callers[0] == CONFIG["admin"][0], f"the force-unlock names who did it ({callers})")
    Select(admin.find_element(By.NAME, "operation")).select_by_value("restore")
    click_then(admin, admin.find_element(By.CSS_SELECTOR, "#audit-filter button"),
               (By.ID, "audit"), "the trail filtered to restores")
    ops = texts(admin, "#audit td.operation")
    check(ops == ["restore"], f"the filter shows restores only ({ops})")
finally:
    admin.quit()
print("ALL PASSED", flush=True)
