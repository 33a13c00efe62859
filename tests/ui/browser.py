"""Debian's Chromium driven by selenium through Debian's chromedriver, for the page's tests.

The driver and the browser are the installed ones (`/usr/bin/chromedriver`,
`/usr/bin/chromium`, from `.ci/run`): the Service gets the driver's path explicitly, so
selenium-manager never runs and nothing is downloaded. Without them the tests are
`tests.components.missing` (a skip here, a failure under CI=true).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.components import missing

CHROMIUM = os.environ.get("CKPTGUARD_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CKPTGUARD_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless Chromium with a fresh profile, closed (and its profile removed) after."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        missing(f"Chromium and its driver ({CHROMIUM}, {CHROMEDRIVER}): "
                "apt-get install chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium (the test extras)")
    profile = tempfile.mkdtemp(prefix="ckptguard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
