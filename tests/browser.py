"""Open a page in the system's headless Chromium (selenium + Debian's chromedriver) the way a
person would: what the console logged, the figures as drawn, the totals as shown, a screenshot.

Also the tool that makes docs/img/*.png:  python tests/browser.py PAGE.html OUT.png
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP = os.path.join(HERE, "setup_browser.sh")
WIDTH = 1100


def ensure_browser() -> tuple[str, str]:
    """(chromium, chromedriver) paths; runs tests/setup_browser.sh (apt) when either is missing."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        subprocess.run(["sh", SETUP], check=True)
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        raise RuntimeError("Chromium and chromedriver are needed: apt-get install -y chromium chromium-driver "
                           "(tests/setup_browser.sh does it as root)")
    return chromium, driver


def start():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = ensure_browser()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={WIDTH},900",
              "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


# What the page shows, read in the browser: every figure's SVG marks, every total as displayed.
PROBE = """
const figs = [...document.querySelectorAll('figure[data-figure]')].map(f => {
  const svg = f.querySelector('svg'); const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {name: f.dataset.figure, svg: !!svg, marks: svg ? svg.querySelectorAll('path, rect, use').length : 0,
          width: box.width, height: box.height};
});
const totals = Object.fromEntries([...document.querySelectorAll('[data-total]')].map(e => [e.dataset.total, e.textContent]));
return {figures: figs, totals: totals, title: document.title, sections: [...document.querySelectorAll('section')].map(s => s.id)};
"""


def inspect(driver, path: str) -> dict:
    driver.get("file://" + os.path.abspath(path))
    page = driver.execute_script(PROBE)
    page["severe"] = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    return page


def screenshot(driver, path: str, out: str, max_bytes: int = 400_000) -> int:
    """A full-page PNG of ``path``, palette-quantised (Pillow) to stay under ``max_bytes``."""
    from PIL import Image

    driver.set_window_size(WIDTH, 900)  # scrollHeight is at least the window's: measure from a small one
    driver.get("file://" + os.path.abspath(path))
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(WIDTH, height + 20)
    driver.save_screenshot(out)
    img = Image.open(out).convert("RGB")
    for colors in (128, 64, 32):
        img.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
        if os.path.getsize(out) <= max_bytes:
            break
    return os.path.getsize(out)


if __name__ == "__main__":
    d = start()
    try:
        for html_path, png in zip(sys.argv[1::2], sys.argv[2::2]):
            print(png, screenshot(d, html_path, png), "bytes")
    finally:
        d.quit()
