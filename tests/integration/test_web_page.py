"""The web page in a real browser: Debian's chromium, headless, driven by
its chromedriver through Selenium, on the page rest_mccloud serves over
TLS (the test's own certificate, which the browser is told to accept).

alice logs in with her LDAP password, sees her group's VMs and not bob's,
provisions a new nsbox VM through the form and follows its job to the
end, reads its root password (decrypted in the browser: WebCrypto
RSA-OAEP), is refused bob's VM with the reason, and destroys hers. The
screenshots land in ``tests/artifacts/api/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.integration.conftest import API_VMS, NODE
from tests.support import ldapserver
from tests.support.api import ApiSetup

A1, A2, B1 = sorted(API_VMS)
NEW = "a3.teama.lan"
SHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "api"


@pytest.fixture(scope="module")
def browser(api_cloud: Any) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never Selenium Manager's downloads
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1280,900", "--ignore-certificate-errors",
                "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.accept_insecure_certs = True
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def wait(driver: Any, what: Callable[[Any], Any], secs: float = 30, why: str = "") -> Any:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, secs, poll_frequency=0.2).until(what)
    except TimeoutException:
        driver.save_screenshot(str(SHOTS / "failed.png"))
        raise AssertionError(f"{why or what}: not within {secs:.0f} s; the page said: "
                             f"{text(driver, 'error')!r} (screenshot failed.png)") from None


def shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(SHOTS / name))


def loaded(view: str) -> Callable[[Any], bool]:
    """The page shows ``view`` (``vm/<name>``; ``job``: any job), loaded."""
    def shown(d: Any) -> bool:
        now = d.execute_script("const v = document.querySelector('#view > div'); return v && v.dataset.loaded;")
        return bool(now) and (now == view or now.startswith(view + "/"))
    return shown


def text(driver: Any, element_id: str) -> str:
    """The text of element ``element_id`` now ("" without it): read in the
    page, since the job's card is replaced at each poll."""
    return str(driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.textContent : '';", element_id))


def ended(driver: Any) -> str | bool:
    state = text(driver, "job-state")
    return state not in ("", "running") and state


def error_text(driver: Any) -> str:
    box = driver.find_element("id", "error")
    return str(box.text) if box.is_displayed() else ""


def fill(form: Any, **values: str) -> None:
    from selenium.webdriver.support.ui import Select

    for name, value in values.items():
        field = form.find_element("name", name)
        if field.tag_name == "select":
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(value)


def press(form: Any) -> None:
    form.find_element("css selector", "button[type=submit]").click()


def test_alice_provisions_and_follows_her_vm(browser: Any, api_setup: ApiSetup) -> None:
    d = browser
    d.get(api_setup.tls_url + "/mccloud")
    form = wait(d, lambda d: d.find_element("id", "login-form"), why="the login form")
    assert d.execute_script("return window.isSecureContext && !!crypto.subtle") is True
    shot(d, "01-login.png")

    fill(form, username="alice", password="wrong", eauth="ldap")
    press(form)
    wait(d, lambda d: "wrong user name or password" in error_text(d), why="the refused login")

    fill(form, username="alice", password=ldapserver.PASSWORD)
    press(form)
    wait(d, loaded("inventory"), why="the inventory")
    assert "alice (teama)" in d.find_element("id", "who").text
    found = {r.get_attribute("data-vm"): [t.text for t in r.find_elements("css selector", "td:last-child > *")]
             for r in d.find_elements("css selector", "#vms tr[data-vm]")}
    # Hers, and only her group's: a VM the node's owners give teama (a guest
    # another module left on the shared node) is hers too; bob's is not there.
    assert {A1, A2} <= set(found) and B1 not in found, found
    assert all("teama" in owners for owners in found.values()), found
    assert d.find_elements("css selector", f"#nodes tr[data-node='{NODE}'] .bar"), "no capacity bars"
    shot(d, "02-inventory.png")

    # A new VM through the form; the job page follows it to its end.
    d.find_element("css selector", "a[data-nav=provision]").click()
    wait(d, loaded("provision"), why="the provision form")
    form = d.find_element("id", "form-provision")
    # The node is required (a new VM needs one); the owners default to the caller's groups.
    node = form.find_element("name", "node")
    options = [o.get_attribute("value") for o in node.find_elements("tag name", "option")]
    assert node.get_attribute("required") is not None and "" not in options and NODE in options, options
    assert "your groups" in form.find_element("name", "owners").get_attribute("placeholder")
    fill(form, name=NEW, node=NODE, owners="teama")
    press(form)
    wait(d, loaded("job"), why="the job page")
    state = wait(d, ended, secs=240, why="the provision's end")
    shot(d, "03-provision-job.png")
    assert state == "succeeded", text(d, "job-messages")

    # In the inventory with its ssh line; its card: the password decrypted here.
    d.find_element("css selector", "a[data-nav=inventory]").click()
    wait(d, loaded("inventory"), why="the inventory with the new VM")
    line = d.find_element("css selector", f"#vms tr[data-vm='{NEW}'] code.ssh").text
    assert line.startswith("ssh -p "), line
    shot(d, "04-inventory-with-vm.png")
    d.find_element("css selector", f"#vms tr[data-vm='{NEW}']").click()
    wait(d, loaded(f"vm/{NEW}"), why="the VM's card")
    ssh = d.find_element("id", "vm-ssh").text
    assert ssh.startswith("ssh -p ") and " root@" in ssh, ssh
    d.find_element("id", "password-button").click()
    secret = wait(d, lambda d: text(d, "password-value"), why="the decrypted password")
    assert len(secret) >= 8
    shot(d, "05-vm-card.png")

    # bob's VM, by its address: refused, with the reason.
    d.get(api_setup.tls_url + f"/mccloud#/vm/{B1}")
    reason = wait(d, lambda d: error_text(d), why="the refusal")
    assert "403" in reason and "alice" in reason and "teamb" in reason, reason
    shot(d, "06-refused.png")
    # A malformed address (decodeURIComponent throws on it): the inventory.
    d.get(api_setup.tls_url + "/mccloud#/vm/%E0%A4%A")
    wait(d, loaded("inventory"), why="the inventory for a malformed address")

    # Destroyed through its card (the page asks first).
    d.get(api_setup.tls_url + f"/mccloud#/vm/{NEW}")
    wait(d, loaded(f"vm/{NEW}"), why="the VM's card again")
    press(d.find_element("id", "form-destroy"))
    d.switch_to.alert.accept()
    wait(d, loaded("job"), why="the destroy's job")
    state = wait(d, ended, secs=120, why="the destroy's end")
    shot(d, "07-destroy-job.png")
    assert state == "succeeded", text(d, "job-messages")
    d.find_element("css selector", "a[data-nav=inventory]").click()
    wait(d, loaded("inventory"), why="the inventory after the destroy")
    rows = {r.get_attribute("data-vm") for r in d.find_elements("css selector", "#vms tr[data-vm]")}
    assert NEW not in rows, rows
