"""Drive the console's state viewer, comparison and search in headless
Chromium (Debian's chromium and chromedriver, through selenium), as a
reader who may read some workspaces of a backend only.

Run by tests/integration/console_viewer.rs with one argument, a JSON file:
  {"base": "http://127.0.0.1:PORT", "backend": "...", "workspace": "...",
   "reader": ["user", "password"], "serial": N, "first_serial": N,
   "from_version": "id", "writer": "user", "secrets": ["..."],
   "encrypted": "workspace", "hidden": "workspace", "screenshots": "/dir"}
Prints one line per check; exits 1 with the reason on the first failure.
"""

import json
import sys
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CONFIG = json.loads(Path(sys.argv[1]).read_text())
BASE = CONFIG["base"]
SHOTS = Path(CONFIG["screenshots"])
SHOTS.mkdir(parents=True, exist_ok=True)
DEADLINE = 60
STARTED = time.monotonic()


def fail(reason):
    print(f"FAIL {reason}", flush=True)
    sys.exit(1)


def check(condition, reason):
    if not condition:
        fail(reason)
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
    try:
        bodies = driver.find_elements(By.TAG_NAME, "body")
        return bodies[0].text if bodies else ""
    except WebDriverException as e:
        return f"(no page text: {e.__class__.__name__})"


def wait_for(driver, condition, what):
    try:
        return WebDriverWait(driver, DEADLINE).until(condition)
    except TimeoutException:
        fail(f"{what}: not within {DEADLINE} s; at {driver.current_url}: {body_text(driver)!r}")


def page_complete(driver):
    try:
        return driver.execute_script("return document.readyState") == "complete"
    except WebDriverException:
        return False


def old_page_gone(driver):
    try:
        return driver.execute_script("return window.__wasmstate_old_page !== true")
    except WebDriverException:
        return False


def loaded(driver, locator, what):
    wait_for(driver, page_complete, f"{what} (page still loading)")
    return wait_for(driver, EC.presence_of_element_located(locator), what)


def open_page(driver, url, locator, what):
    driver.get(url)
    return loaded(driver, locator, what)


def click_then(driver, element, locator, what):
    """Click `element`, which loads another page; `locator` on that page
    (the old window's mark gone first, so the old page is never asked)."""
    driver.execute_script("window.__wasmstate_old_page = true")
    element.click()
    wait_for(driver, old_page_gone, f"{what} (the old page stayed)")
    return loaded(driver, locator, what)


def texts(driver, selector):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def no_secret(driver, where):
    html = driver.page_source
    leaked = [s for s in CONFIG["secrets"] if s in html]
    check(not leaked, f"no sensitive value in the HTML of {where} (found: {leaked})")


backend, workspace = CONFIG["backend"], CONFIG["workspace"]
versions_page = f"{BASE}/ui/backends/{backend}/{workspace}"
state_page = f"{versions_page}/state"

driver = browser()
try:
    button = open_page(driver, f"{BASE}/ui/login", (By.ID, "sign-in"), "the login form")
    driver.find_element(By.ID, "user").send_keys(CONFIG["reader"][0])
    driver.find_element(By.ID, "password").send_keys(CONFIG["reader"][1])
    click_then(driver, button, (By.ID, "backends"), "the backends page after signing in")

    # From the versions page to what the current state holds.
    link = open_page(driver, versions_page, (By.ID, "view-state"), "the link to the state")
    click_then(driver, link, (By.ID, "state-facts"), "the state viewer")
    shot = lambda name: driver.save_screenshot(str(SHOTS / f"{name}.png"))
    shot("state")
    serial = driver.find_element(By.ID, "state-serial").text
    check(serial == str(CONFIG["serial"]), f"the viewer shows serial {CONFIG['serial']} ({serial!r})")
    writer = driver.find_element(By.ID, "state-writer").text
    check(CONFIG["writer"] in writer, f"the viewer names who wrote the state ({writer!r})")
    lineage = driver.find_element(By.ID, "state-lineage").text
    check(len(lineage) > 10, f"the viewer shows the lineage ({lineage!r})")
    heading = texts(driver, "main h2")
    check("105 resources, 108 instances" in heading, f"the totals count every resource and instance ({heading})")
    net = 'tr[data-module="module.net"][data-type="terraform_data"]'
    counts = (driver.find_element(By.CSS_SELECTOR, f"{net} td.resources").text,
              driver.find_element(By.CSS_SELECTOR, f"{net} td.instances").text)
    check(counts == ("2", "5"), f"module.net's terraform_data: 2 resources, 5 instances (count 3 + for_each 2) ({counts})")
    root = driver.find_element(By.CSS_SELECTOR, 'tr[data-module=""][data-type="terraform_data"] td.resources').text
    check(root == "103", f"the root module's terraform_data: 103 resources ({root!r})")
    rows = driver.find_elements(By.CSS_SELECTOR, "#resources tbody tr")
    check(len(rows) == 100, f"the first page lists 100 resources ({len(rows)})")
    pw = driver.find_element(By.CSS_SELECTOR, 'tr[data-output="pw"] td.value').text
    check(pw == "(sensitive)", f"the sensitive output is masked ({pw!r})")
    greeting = driver.find_element(By.CSS_SELECTOR, 'tr[data-output="greeting"] td.value').text
    check('"hello"' in greeting, f"a plain output shows its value ({greeting!r})")
    no_secret(driver, "the state viewer")

    nxt = driver.find_element(By.CSS_SELECTOR, '#resource-pages a[rel="next"]')
    click_then(driver, nxt, (By.CSS_SELECTOR, "#resources"), "the second page of resources")
    shot("state-page-2")
    addresses = texts(driver, "#resources td code")
    check(len(addresses) == 5 and "module.net.terraform_data.f" in addresses,
          f"the second page holds the last 5 resources ({addresses})")
    check("page 2 of 2" in driver.find_element(By.ID, "resource-pages").text, "the pager says page 2 of 2")

    # A kept version, from its row.
    view = open_page(driver, versions_page,
                     (By.CSS_SELECTOR, f'tr[data-version="{CONFIG["from_version"]}"] a.view'),
                     "the view link of the first apply's version")
    click_then(driver, view, (By.ID, "state-facts"), "the first apply's version")
    serial = driver.find_element(By.ID, "state-serial").text
    check(serial == str(CONFIG["first_serial"]), f"the version shows its own serial ({serial!r})")
    check(driver.find_element(By.ID, "state-version").text == CONFIG["from_version"], "the version is named")
    no_secret(driver, "a kept version")

    # A comparison: each changed instance's attributes, old and new.
    open_page(driver, f"{versions_page}?from={CONFIG['from_version']}&to=current",
              (By.ID, "instance-changes"), "the comparison's details")
    b = '.instance-change[data-address="terraform_data.b"] tr[data-attribute="input"]'
    old, new = (driver.find_element(By.CSS_SELECTOR, f"{b} td.old").text,
                driver.find_element(By.CSS_SELECTOR, f"{b} td.new").text)
    check('"one"' in old and '"two"' in new, f"terraform_data.b's input shows old and new ({old!r} → {new!r})")
    s = '.instance-change[data-address="terraform_data.s"] tr[data-attribute="input"]'
    masked = driver.find_element(By.CSS_SELECTOR, f"{s} td.new").text
    check(masked == "(sensitive)", f"a changed sensitive attribute is masked ({masked!r})")
    raw = driver.find_element(By.CSS_SELECTOR, '.instance-change[data-address="terraform_data.b"] details.raw')
    pre = raw.find_element(By.CSS_SELECTOR, "pre.new-json")
    check(not pre.is_displayed(), "the raw JSON is folded away")
    raw.find_element(By.TAG_NAME, "summary").click()
    wait_for(driver, lambda d: pre.is_displayed(), "the raw JSON unfolds")
    check('"two"' in pre.text, f"one click shows the instance's raw JSON ({pre.text[:80]!r})")
    shot("comparison")
    no_secret(driver, "the comparison")

    # Search from the workspaces page: only readable workspaces.
    box = open_page(driver, f"{BASE}/ui/backends/{backend}", (By.CSS_SELECTOR, "#search input[name=q]"),
                    "the search form")
    box.send_keys("terraform_data.a")
    click_then(driver, driver.find_element(By.CSS_SELECTOR, "#search button"), (By.ID, "search-scope"),
               "the search's answer")
    shot("search")
    hits = [e.get_attribute("data-workspace") for e in driver.find_elements(By.CSS_SELECTOR, "#hits tr[data-workspace]")]
    check(hits == [workspace], f"the search finds the state holding terraform_data.a ({hits})")
    check(CONFIG["hidden"] not in driver.page_source,
          "the search never names a workspace the reader may not read")
    enc = driver.find_element(By.ID, "search-encrypted").text
    check(CONFIG["encrypted"] in enc, f"the search says which states OpenTofu encrypted ({enc!r})")
    open_page(driver, f"{BASE}/ui/search/{backend}?q=module.net.terraform_data.c", (By.ID, "search-scope"),
              "a search by module address")
    check([e.get_attribute("data-workspace") for e in driver.find_elements(By.CSS_SELECTOR, "#hits tr[data-workspace]")] == [workspace],
          "a search by full address finds it too")
    open_page(driver, f"{BASE}/ui/search/{backend}?q=aws_s3_bucket.none", (By.ID, "no-hits"), "a search finding nothing")
    check(True, "a search for what no state holds says so")

    # An OpenTofu-encrypted state: shown as such, not as an error.
    open_page(driver, f"{BASE}/ui/backends/{backend}/{CONFIG['encrypted']}/state", (By.ID, "encrypted"),
              "the encrypted state's page")
    shot("encrypted")
    check("Encrypted by OpenTofu" in driver.find_element(By.ID, "encrypted").text, "the page says OpenTofu encrypted it")
    check(driver.find_element(By.ID, "state-serial").text == "1", "its clear serial is shown")

    # A workspace the reader may not read: refused, nothing of it shown.
    driver.get(f"{BASE}/ui/backends/{backend}/{CONFIG['hidden']}/state")
    wait_for(driver, page_complete, "the refused page")
    check(not driver.find_elements(By.ID, "state-facts") and "terraform_data" not in driver.page_source,
          f"a workspace the reader may not read is not shown ({body_text(driver)!r})")
finally:
    driver.quit()
print("ALL PASSED", flush=True)
