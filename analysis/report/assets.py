"""The offline scripts every page loads from `reports/assets/`: vega, vega-lite, vega-embed, and ours.

`vl_convert.javascript_bundle()` is one classic (non-module) script that sets window.vegaEmbed,
window.vega and window.vegaLite, with every dependency inside, so pages need no network and no
module loader. It is about 0.9 MB: written once per vl-convert version, never inlined into pages.
"""

from __future__ import annotations

import vl_convert

from analysis.report.site import ASSETS_DIR, Site

# Renders the charts the page's data script listed in window.REPORT_CHARTS, and for each picker
# (<select data-chart=SLOT>, pages.Choice) the chosen option's chart, loaded by a <script> whose file
# calls window.REPORT_DRAW; then marks <body> so a test (or a person) can tell "still rendering" from
# "done" and "failed". A drawn choice's slot says which file it shows in data-shown.
EMBED_JS = """\
(function () {
  var views = {}, waiting = {};
  function draw(chart) {
    if (views[chart.id]) views[chart.id].finalize();
    return vegaEmbed("#" + chart.id, chart.spec, {actions: false, renderer: chart.renderer}).then(function (r) {
      views[chart.id] = r;
    });
  }
  window.REPORT_DRAW = function (chart) {
    var done = waiting[chart.id];
    if (chart.file !== done.file) return;  // a file the reader has since picked another over
    draw(chart).then(function () {
      document.getElementById(chart.id).dataset.shown = chart.file;
      done.resolve();
    }, done.reject);
  };
  function load(select) {
    return new Promise(function (resolve, reject) {
      var slot = select.dataset.chart, script = document.createElement("script");
      waiting[slot] = {file: select.value, resolve: resolve, reject: reject};
      script.src = select.value;
      script.onerror = function () { reject(new Error("cannot load " + select.value)); };
      document.body.appendChild(script);
    });
  }
  var pickers = Array.prototype.slice.call(document.querySelectorAll("select[data-chart]"));
  pickers.forEach(function (select) {
    select.addEventListener("change", function () { load(select).catch(console.error); });
  });
  Promise.all((window.REPORT_CHARTS || []).map(draw).concat(pickers.map(load))).then(function () {
    document.body.dataset.charts = "rendered";
  }).catch(function (error) {
    document.body.dataset.charts = "failed";
    console.error(error);
  });
})();
"""

# The index's picker of two runs (analysis.report.diff_index): opens the pair's diff page, where there is one.
DIFF_PICKER_JS = """\
(function () {
  var form = document.querySelector("form.diff-picker");
  if (!form) return;
  var pages = JSON.parse(form.dataset.pages);
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var page = pages[form.elements.a.value + "\\n" + form.elements.b.value];
    if (page) window.location.href = page;
    else form.querySelector("output").textContent = "These two runs were never compared: " +
      "make diff A=traces/" + form.elements.a.value + " B=traces/" + form.elements.b.value + ", then make report.";
  });
})();
"""

STYLE_CSS = """\
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin-top: 1.2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: right; }
td { white-space: nowrap; } td.text { white-space: normal; } /* numbers stay whole, words and headers wrap */
th { background: #f4f4f4; cursor: help; } td.text, th.text { text-align: left; }
tr.error td { background: #fff0f0; } td.error { text-align: left; white-space: normal; color: #a00; }
tr.flagged td { background: #fff8e0; } tr.significant td { background: #eef5ff; font-weight: bold; }
tr.not-pipeline td { background: #f0f4ff; } td.trust-low { color: #a00; font-weight: bold; }
.low-trust-banner { border-left: 4px solid #c00; background: #fff0f0; padding: 0.3em 1em; margin: 0.5em 0; }
.verdict { border-left: 4px solid #2a6; background: #f2fbf5; padding: 0.3em 1em; max-width: 70em; }
.verdict p { margin: 0.3em 0; } .trust-low-mark { color: #a00; font-size: 0.8em; }
table.prose td.text { min-width: 6em; }
.caption, .note { color: #555; max-width: 70em; margin: 0.3em 0 0.8em; }
.chart { margin: 0.5em 0 0.3em; } .figures { display: flex; gap: 2.5em; flex-wrap: wrap; }
.figure b { font-size: 1.35em; display: block; } .figure { cursor: help; }
code { background: #f4f4f4; padding: 0 3px; }
"""


def bundle_name() -> str:
    return f"vega-bundle-{vl_convert.__version__}.js"


def write_assets(site: Site) -> None:
    """Write the bundle once (its name carries the version) and keep our small files current."""
    assets = site.out / ASSETS_DIR
    bundle = assets / bundle_name()
    if bundle.is_file():
        site.keep(bundle)
    else:
        site.write({bundle: vl_convert.javascript_bundle()})
    site.write({assets / "embed.js": EMBED_JS + DIFF_PICKER_JS, assets / "report.css": STYLE_CSS})
