#!/usr/bin/env python3
"""The doctor's HTML report, opened in a real browser (Debian's headless Chromium).

Usage: report_in_browser_test.py DTRAIN_BINARY

Two reports are made by real doctor runs: a scaling study (1 and 2 workers, with the
what-if curve and each scale's loss) and a comparison of strategies. Each is opened
with the network cut off (every host name unresolvable, every request sent to a closed
proxy) and checked:
  - it renders: a screenshot holds the charts' colours over a real area;
  - its charts have their data: measured in the browser's own layout (getBBox), every
    bar's height is its value on the chart's scale, the phases of a step stack to the
    whole, every point lies inside its plot, a larger loss is drawn higher up, and the
    throughput bars carry the figures the doctor printed;
  - it fetched nothing: the page's resource timing lists no request at all, and no
    element refers to another file.
Exits 0 when every check holds, 1 naming the first that does not, 77 (skipped) where no
headless Chromium is installed.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

SECONDS = 120  # each command's bound

# The chart geometry the report draws with (src/dtrain/profile/report.cpp).
WIDTH, HEIGHT = 640, 300
TOP, PLOT_H = 44, 300 - 44 - 46
LEFT, PLOT_W = 64, 640 - 64 - 150
MEASURED, PREDICTED = (0x3B, 0x6E, 0xA5), (0xD9, 0x82, 0x2B)

CONFIG = {
    "model": {"input_shape": [8], "layers": [
        {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 3}}]},
    "loss": {"name": "sparse_categorical_crossentropy", "from_logits": True},
    "optimizer": {"name": "adam", "learning_rate": 0.01},
    "metrics": ["accuracy"],
    "data": {"source": "synthetic", "samples": 2000, "test_samples": 400, "features": 8, "classes": 3,
             "labels": "teacher"},
    "epochs": 3, "batch_size": 32, "seed": 4,
}

# Appended to a copy of the page: reads what the browser laid out and writes it into the
# document, which --dump-dom then prints. Data marks are the shapes with a tooltip.
PROBE = """
<script>
window.addEventListener('load', () => {
  const out = {resources: performance.getEntriesByType('resource').map(e => e.name), charts: [],
               linked: [...document.querySelectorAll('[src], [href], link, iframe, object, embed')]
                           .map(e => e.outerHTML.slice(0, 120))};
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    const marks = [];
    for (const el of svg.querySelectorAll('rect, circle, line')) {
      const tip = el.querySelector('title');
      if (!tip) continue;
      const b = el.getBBox();
      marks.push({tag: el.tagName, tip: tip.textContent, x: b.x, y: b.y, w: b.width, h: b.height});
    }
    const lines = [...svg.querySelectorAll('polyline')].map(p => p.points.numberOfItems);
    out.charts.push({title: svg.getAttribute('aria-label'), width: box.width, height: box.height, marks, lines});
  }
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


class Failed(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failed(what)


def browser():
    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    print("SKIPPED: no headless Chromium: install Debian's chromium-headless-shell (scripts/install-deps.sh does)")
    sys.exit(77)


def run_browser(chromium, page, profile, extra):
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + profile,
               "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--no-first-run",
               "--window-size=1340,1100", *extra, "file://" + page]
    done = subprocess.run(command, capture_output=True, timeout=SECONDS, text=True)
    check(done.returncode == 0, f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def png_pixels(path):
    """The RGB pixels of an 8-bit RGB or RGBA PNG, as a list of rows of (r, g, b)."""
    data = open(path, "rb").read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG")
    at, idat, width = 8, b"", 0
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            check(depth == 8 and colour in (2, 6), f"{path}: PNG of depth {depth}, colour type {colour}")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for r in range(height):
        line = raw[r * (stride + 1):(r + 1) * (stride + 1)]
        kind, cur = line[0], bytearray(line[1:])
        for i in range(stride):
            a = cur[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            if kind == 1:
                cur[i] = (cur[i] + a) & 255
            elif kind == 2:
                cur[i] = (cur[i] + b) & 255
            elif kind == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(cur)
        previous = cur
    return [[tuple(row[i:i + 3]) for i in range(0, stride, channels)] for row in rows]


def count_colour(pixels, colour):
    return sum(1 for row in pixels for p in row if all(abs(p[k] - colour[k]) <= 2 for k in range(3)))


def number(text, pattern):
    m = re.search(pattern, text)
    check(m is not None, f"tooltip '{text}' lacks {pattern}")
    return float(m.group(1))


def inside_plot(mark, what):
    # Points may sit on the plot's edges (a loss at the top of its axis, a curve at 100%).
    cx, cy = mark["x"] + mark["w"] / 2, mark["y"] + mark["h"] / 2
    check(LEFT - 1 <= cx <= LEFT + PLOT_W + 1 and TOP - 1 <= cy <= TOP + PLOT_H + 1,
          f"{what}: '{mark['tip']}' drawn at ({cx:.1f}, {cy:.1f}), outside the plot")


def proportional(bars, value_of, what):
    """Every bar's height, laid out by the browser, is its value on one scale from the axis."""
    check(len(bars) >= 2, f"{what}: {len(bars)} bars")
    scale = None
    for bar in bars:
        check(abs(bar["y"] + bar["h"] - (TOP + PLOT_H)) < 0.5, f"{what}: '{bar['tip']}' does not stand on the axis")
        value = value_of(bar["tip"])
        check(value > 0, f"{what}: '{bar['tip']}' has no value")
        if scale is None:
            scale = bar["h"] / value
        # Tooltips give whole numbers: half a unit on the scale, and a little for layout.
        check(abs(bar["h"] - value * scale) <= 0.5 * scale + max(0.6, 0.01 * bar["h"]),
              f"{what}: '{bar['tip']}' is {bar['h']:.1f} high, {value * scale:.1f} on the scale of the first bar")


def larger_is_drawn_higher(points, value_of, what):
    """Among a series of points, a larger value is drawn higher up (at a smaller y)."""
    ordered = sorted(points, key=lambda m: value_of(m["tip"]))
    for a, b in zip(ordered, ordered[1:]):
        if value_of(a["tip"]) < value_of(b["tip"]) - 1e-9:
            check(a["y"] > b["y"] - 0.01, f"{what}: '{a['tip']}' is drawn above '{b['tip']}'")


def probe(chromium, html, work, name):
    page = os.path.join(work, name + ".probe.html")
    with open(html) as f:
        text = f.read()
    check("</body>" in text, f"{html} has no </body>")
    with open(page, "w") as f:
        f.write(text.replace("</body>", PROBE + "</body>"))
    dom = run_browser(chromium, page, os.path.join(work, name + ".profile"), ["--dump-dom"])
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    check(m is not None, f"{name}: the browser ran no probe (the page did not load?)")
    out = json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&"))
    check(out["resources"] == [], f"{name}: the page fetched {out['resources']}")
    check(out["linked"] == [], f"{name}: the page refers to other files: {out['linked']}")
    charts = {c["title"]: c for c in out["charts"]}
    for c in out["charts"]:
        # Its own size, and the 1-pixel border the page's style gives it.
        check((c["width"], c["height"]) == (WIDTH + 2, HEIGHT + 2), f"{name}: chart '{c['title']}' laid out at "
              f"{c['width']}x{c['height']}, not {WIDTH}x{HEIGHT} and its border")
        check(c["marks"], f"{name}: chart '{c['title']}' has no data marks")
    return charts


def screenshot(chromium, html, work, name, colours):
    png = os.path.join(work, name + ".png")
    run_browser(chromium, html, os.path.join(work, name + ".shot"), ["--screenshot=" + png])
    pixels = png_pixels(png)
    for label, colour in colours:
        n = count_colour(pixels, colour)
        check(n >= 200, f"{name}: the screenshot has {n} pixels of the {label} colour #%02x%02x%02x" % colour)


def scaling_report(dtrain, chromium, work):
    config = os.path.join(work, "job.json")
    with open(config, "w") as f:
        json.dump(CONFIG, f)
    html = os.path.join(work, "scaling.html")
    done = subprocess.run([dtrain, "doctor", config, "--replicas", "1", "--workers", "1,2", "--steps", "10",
                           "--rounds", "1", "--threads-per-worker", "1",
                           "--what-if", "workers=8,link=1Gbit,latency=20us", "--report", html],
                          capture_output=True, text=True, timeout=SECONDS)
    check(done.returncode == 0, f"dtrain doctor exited {done.returncode}: {done.stdout[-3000:]}{done.stderr[-2000:]}")
    charts = probe(chromium, html, work, "scaling")
    for title in ("Throughput against scale", "Scaling efficiency", "Where each step's time went",
                  "Loss against time, each scale", "Predicted scaling efficiency"):
        check(title in charts, f"scaling: no chart '{title}' among {list(charts)}")

    marks = charts["Throughput against scale"]["marks"]
    bars = [m for m in marks if m["tag"] == "rect" and not m["tip"].startswith("replayed")]
    proportional(bars, lambda t: number(t, r": (\d+) samples/s"), "throughput")
    for bar in bars:  # the figure the doctor printed in its table
        figure = str(int(number(bar["tip"], r": (\d+) samples/s")))
        check(figure in done.stdout, f"throughput: '{bar['tip']}', but the doctor's output lacks {figure}")
    # The model check's points (predicted, replayed) at their figures on the bars' scale.
    scale = bars[0]["h"] / number(bars[0]["tip"], r": (\d+) samples/s")
    points = [m for m in marks if m["tip"].startswith(("predicted", "replayed"))]
    check(any(m["tip"].startswith("replayed") for m in points), "throughput: no run replayed from its own steps")
    for m in points:
        inside_plot(m, "throughput")
        value = number(m["tip"], r" (\d+) samples/s")
        check(str(int(value)) in done.stdout, f"throughput: '{m['tip']}', but the doctor's output lacks {int(value)}")
        centre = m["y"] + m["h"] / 2
        check(abs(TOP + PLOT_H - centre - value * scale) <= 0.5 * scale + 1,
              f"throughput: '{m['tip']}' drawn at y {centre:.1f}, not at its figure on the bars' scale")
    check(charts["Throughput against scale"]["lines"] == [len(bars)], "throughput: no linear-scaling line")
    proportional(charts["Scaling efficiency"]["marks"], lambda t: number(t, r": (\d+)% of linear"), "efficiency")

    # Each scale's phases stack to the whole plot height (100%).
    stacks = {}
    for m in charts["Where each step's time went"]["marks"]:
        stacks.setdefault(m["tip"].split(" ")[0], []).append(m)
    check(len(stacks) == 2, f"phases: stacks for {list(stacks)}")
    for scale, parts in stacks.items():
        total = sum(p["h"] for p in parts)
        share = sum(number(p["tip"], r": ([\d.]+)%") for p in parts)
        check(abs(share - 100) < 1.0, f"phases: {scale}'s shares add up to {share:.1f}%")
        check(abs(total - PLOT_H) < 1.5, f"phases: {scale}'s stack is {total:.1f} high, the plot {PLOT_H}")

    loss = charts["Loss against time, each scale"]
    points = [m for m in loss["marks"] if m["tag"] == "circle"]
    check(len(points) >= 4, f"loss: {len(points)} points for 2 scales")
    for p in points:
        inside_plot(p, "loss")
    for scale in ("1×1", "2×1"):
        series = [p for p in points if p["tip"].startswith(scale + ",")]
        check(series, f"loss: no points for {scale}")
        larger_is_drawn_higher(series, lambda t: number(t, r"loss ([\d.]+)"), "loss " + scale)
    check(len(loss["lines"]) == 2 and all(n >= 2 for n in loss["lines"]), f"loss: lines {loss['lines']}")

    curve = charts["Predicted scaling efficiency"]
    for p in curve["marks"]:
        inside_plot(p, "what-if curve")
    predicted = [m for m in curve["marks"] if "workers:" in m["tip"]]
    check(len(predicted) >= 3, f"what-if curve: {len(predicted)} predicted points")
    larger_is_drawn_higher(predicted, lambda t: number(t, r": (\d+)%"), "what-if curve")
    check(any(m["tip"].startswith("measured") for m in curve["marks"]), "what-if curve: no measured point")

    screenshot(chromium, html, work, "scaling", [("measured", MEASURED), ("predicted", PREDICTED)])


def strategies_report(dtrain, chromium, work):
    config = os.path.join(work, "job.json")
    html = os.path.join(work, "strategies.html")
    done = subprocess.run([dtrain, "doctor", config, "--strategies", "multi_worker,parameter_server", "--workers", "2",
                           "--epochs", "3", "--report", html],
                          capture_output=True, text=True, timeout=SECONDS)
    check(done.returncode == 0, f"dtrain doctor --strategies exited {done.returncode}: {done.stdout[-3000:]}")
    charts = probe(chromium, html, work, "strategies")
    chart = charts.get("Loss against time, each strategy")
    check(chart is not None, f"strategies: no loss chart among {list(charts)}")
    points = [m for m in chart["marks"] if m["tag"] == "circle"]
    for label in ("MultiWorkerMirroredStrategy", "ParameterServerStrategy (async)"):
        series = [p for p in points if p["tip"].startswith(label + ",")]
        check(len(series) == 3, f"strategies: {len(series)} points for {label}, not one per epoch (3)")
        for p in series:
            inside_plot(p, "strategies")
        larger_is_drawn_higher(series, lambda t: number(t, r"loss ([\d.]+)"), label)
    target = [m for m in chart["marks"] if m["tip"].startswith("target loss")]
    check(len(target) == 1 and target[0]["w"] > PLOT_W * 0.9, "strategies: no dashed target across the plot")
    with open(html) as f:
        check("Recommendation:" in f.read(), "strategies: the page has no recommendation")
    screenshot(chromium, html, work, "strategies", [("measured", MEASURED)])


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    dtrain = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="dtrain_report_")
    try:
        chromium = browser()
        scaling_report(dtrain, chromium, work)
        strategies_report(dtrain, chromium, work)
    except Failed as e:
        print("FAILED:", e)
        print("(pages and screenshots kept in", work + ")")
        return 1
    except subprocess.TimeoutExpired as e:
        print("FAILED: timed out after", SECONDS, "s:", " ".join(e.cmd))
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("the doctor's reports render in", chromium, "with every chart's data and nothing fetched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
