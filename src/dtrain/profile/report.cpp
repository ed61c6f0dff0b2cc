// The doctor's HTML page: charts drawn as inline SVG from the runs' figures.
#include "dtrain/profile/report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dtrain/profile/format.h"

namespace dtrain::profile {
namespace {

using detail::fixed;

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A sentence's words with its first letter upper case.
std::string capitalized(std::string words) {
  if (!words.empty() && words[0] >= 'a' && words[0] <= 'z') words[0] = static_cast<char>(words[0] - 'a' + 'A');
  return words;
}

std::string label(const ScaleRun& r) { return std::to_string(r.workers) + "\u00d7" + std::to_string(r.replicas); }

// A round number at or above v, for an axis top: 1, 1.5, 2, 3, 4, 5, 6 or 8 times a power of ten.
double nice_ceiling(double v) {
  if (v <= 0) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0})
    if (m * p >= v) return m * p;
  return 10 * p;
}

// The plotting area of every chart, in SVG user units.
constexpr double kWidth = 640, kHeight = 300, kLeft = 64, kRight = 150, kTop = 44, kBottom = 46;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

struct Svg {
  std::ostringstream o;
  explicit Svg(const std::string& title) {
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" width=\"" << kWidth
      << "\" height=\"" << kHeight << "\" role=\"img\" aria-label=\"" << escape(title) << "\">\n<text x=\"" << kLeft
      << "\" y=\"20\" class=\"title\">" << escape(title) << "</text>\n";
  }
  // The y axis from 0 to top with five grid lines; `unit` after each tick's value.
  void y_axis(double top, const std::string& unit, int digits) {
    for (int i = 0; i <= 5; ++i) {
      const double v = top * i / 5, y = kTop + kPlotH - kPlotH * i / 5;
      o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + kPlotW << "\" y1=\"" << y << "\" y2=\"" << y
        << "\" class=\"grid\"/><text x=\"" << kLeft - 6 << "\" y=\"" << y + 4 << "\" class=\"tick\" text-anchor=\"end\">"
        << fixed(v, digits) << escape(unit) << "</text>\n";
    }
  }
  void x_label(double x, const std::string& text) {
    o << "<text x=\"" << x << "\" y=\"" << kTop + kPlotH + 16 << "\" class=\"tick\" text-anchor=\"middle\">" << escape(text)
      << "</text>\n";
  }
  void x_title(const std::string& text) {
    o << "<text x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kHeight - 8 << "\" class=\"axis\" text-anchor=\"middle\">"
      << escape(text) << "</text>\n";
  }
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& tip) {
    o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << std::max(0.0, h) << "\" fill=\""
      << fill << "\"><title>" << escape(tip) << "</title></rect>\n";
  }
  void legend(int row, const std::string& fill, const std::string& text, bool line = false) {
    const double x = kLeft + kPlotW + 14, y = kTop + 4 + 18 * row;
    if (line)
      o << "<line x1=\"" << x << "\" x2=\"" << x + 12 << "\" y1=\"" << y + 6 << "\" y2=\"" << y + 6 << "\" stroke=\""
        << fill << "\" stroke-width=\"2\" stroke-dasharray=\"4 2\"/>";
    else
      o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"12\" height=\"12\" fill=\"" << fill << "\"/>";
    o << "<text x=\"" << x + 18 << "\" y=\"" << y + 10 << "\" class=\"tick\">" << escape(text) << "</text>\n";
  }
  std::string done() {
    o << "</svg>\n";
    return o.str();
  }
};

const char* kMeasured = "#3b6ea5";
const char* kIdeal = "#888888";
const char* kPredicted = "#d9822b";
const char* kReplayed = "#4e9a52";

// Samples/s at each scale against linear scaling from the first run, and the model's
// prediction where the model check made one.
std::string throughput_chart(const Report& r) {
  Svg svg("Throughput against scale");
  const ScaleRun& base = r.runs.front();
  const double per_replica = base.samples_per_second / std::max(1, base.replicas_in_sync());
  double top = 0;
  for (const ScaleRun& run : r.runs) top = std::max({top, run.samples_per_second, per_replica * run.replicas_in_sync()});
  for (const Check& c : r.checks)
    top = std::max({top, c.prediction.samples_per_second, c.replayed ? c.replayed->samples_per_second : 0.0});
  top = nice_ceiling(top);
  svg.y_axis(top, "", 0);
  const double slot = kPlotW / static_cast<double>(r.runs.size());
  auto y_of = [&](double v) { return kTop + kPlotH - kPlotH * v / top; };
  std::string ideal;
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const ScaleRun& run = r.runs[i];
    const double x = kLeft + slot * static_cast<double>(i);
    svg.rect(x + slot * 0.2, y_of(run.samples_per_second), slot * 0.6, kPlotH * run.samples_per_second / top, kMeasured,
             label(run) + ": " + fixed(run.samples_per_second, 0) + " samples/s");
    svg.x_label(x + slot / 2, label(run));
    ideal += (i ? " " : "") + fixed(x + slot / 2, 1) + "," + fixed(y_of(per_replica * run.replicas_in_sync()), 1);
    for (const Check& c : r.checks) {
      if (c.workers != run.workers || c.replicas != run.replicas) continue;
      const double cx = x + slot / 2;
      svg.o << "<circle cx=\"" << cx << "\" cy=\"" << y_of(c.prediction.samples_per_second) << "\" r=\"5\" fill=\""
            << kPredicted << "\"><title>predicted " << fixed(c.prediction.samples_per_second, 0)
            << " samples/s</title></circle>\n";
      if (!c.replayed) continue;
      const double cy = y_of(c.replayed->samples_per_second);
      svg.o << "<rect x=\"" << cx - 4 << "\" y=\"" << cy - 4 << "\" width=\"8\" height=\"8\" fill=\"" << kReplayed
            << "\"><title>replayed from its own steps " << fixed(c.replayed->samples_per_second, 0)
            << " samples/s</title></rect>\n";
    }
  }
  svg.o << "<polyline points=\"" << ideal << "\" fill=\"none\" stroke=\"" << kIdeal
        << "\" stroke-width=\"2\" stroke-dasharray=\"4 2\"/>\n";
  svg.legend(0, kMeasured, "measured");
  svg.legend(1, kIdeal, "linear scaling", true);
  if (!r.checks.empty()) svg.legend(2, kPredicted, "model");
  if (std::any_of(r.checks.begin(), r.checks.end(), [](const Check& c) { return c.replayed.has_value(); }))
    svg.legend(3, kReplayed, "replayed");
  svg.x_title("workers \u00d7 replicas per worker (samples/s)");
  return svg.done();
}

// Samples/s per replica against the first run's, as a percentage.
std::string efficiency_chart(const Report& r) {
  Svg svg("Scaling efficiency");
  const ScaleRun& base = r.runs.front();
  const double per_replica = base.samples_per_second / std::max(1, base.replicas_in_sync());
  double top = 1.0;
  std::vector<double> eff;
  for (const ScaleRun& run : r.runs) {
    eff.push_back(per_replica > 0 ? run.samples_per_second / (per_replica * run.replicas_in_sync()) : 0);
    top = std::max(top, eff.back());
  }
  top = std::ceil(top * 5) / 5;
  svg.y_axis(top * 100, "%", 0);
  const double slot = kPlotW / static_cast<double>(r.runs.size());
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const double x = kLeft + slot * static_cast<double>(i);
    const double h = kPlotH * eff[i] / top;
    svg.rect(x + slot * 0.2, kTop + kPlotH - h, slot * 0.6, h, kMeasured,
             label(r.runs[i]) + ": " + detail::percent(eff[i], 0) + " of linear scaling");
    svg.o << "<text x=\"" << x + slot / 2 << "\" y=\"" << kTop + kPlotH - h - 4 << "\" class=\"tick\" text-anchor=\"middle\">"
          << detail::percent(eff[i], 0) << "</text>\n";
    svg.x_label(x + slot / 2, label(r.runs[i]));
  }
  svg.x_title("workers \u00d7 replicas per worker");
  return svg.done();
}

// Each scale's step as 100%, split into its phases.
std::string phases_chart(const Report& r) {
  Svg svg("Where each step's time went");
  struct Part {
    const char* name;
    const char* fill;
  };
  const Part parts[] = {{"input wait", "#8c6bb1"},   {"replica start", "#bdbdbd"}, {"forward", "#4c9a5f"},
                        {"backward", "#8cc084"},     {"communication", "#d9534f"}, {"straggler wait", "#f0ad4e"},
                        {"optimizer", "#5bc0de"},    {"other", "#e0e0e0"}};
  svg.y_axis(100, "%", 0);
  const double slot = kPlotW / static_cast<double>(r.runs.size());
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const ScaleRun& run = r.runs[i];
    const double x = kLeft + slot * static_cast<double>(i);
    svg.x_label(x + slot / 2, label(run));
    if (run.rows.empty()) continue;
    const StepSeconds s = step_seconds(run.rows.front());
    const double step = std::max(s.step, 1e-12);
    const double values[] = {s.input, s.start, s.forward, s.backward, s.comm, s.straggler, s.optimizer, s.other()};
    double y = kTop + kPlotH;
    const double total = std::max(step, s.accounted());
    for (std::size_t p = 0; p < std::size(parts); ++p) {
      const double h = kPlotH * values[p] / total;
      y -= h;
      svg.rect(x + slot * 0.2, y, slot * 0.6, h, parts[p].fill,
               label(run) + " " + parts[p].name + ": " + detail::percent(values[p] / total, 1) + " (" +
                   fixed(values[p] * 1000, 2) + " ms)");
    }
  }
  for (std::size_t p = 0; p < std::size(parts); ++p) svg.legend(static_cast<int>(p), parts[p].fill, parts[p].name);
  svg.x_title("workers \u00d7 replicas per worker (worker 0's step)");
  return svg.done();
}

// One line of loss against training time.
struct LossSeries {
  std::string label;
  std::vector<double> seconds, loss;  // at each epoch's end, from the start of training
};

const char* const kSeriesColours[] = {"#3b6ea5", "#d9822b", "#4c9a5f", "#b04a5a", "#8c6bb1", "#5bc0de", "#777777"};

// Each series' loss at the end of each epoch against the time since training began, and
// the target they were timed to (dashed).
std::string loss_chart(const std::string& title, const std::vector<LossSeries>& series, double target) {
  Svg svg(title);
  double right = 0, top = 0;
  for (const LossSeries& s : series) {
    for (double t : s.seconds) right = std::max(right, t);
    for (double l : s.loss)
      if (std::isfinite(l)) top = std::max(top, l);
  }
  right = nice_ceiling(right);
  top = nice_ceiling(top);
  svg.y_axis(top, "", top < 1 ? 2 : 1);
  for (int i = 0; i <= 4; ++i) svg.x_label(kLeft + kPlotW * i / 4, fixed(right * i / 4, 1));
  auto x_of = [&](double t) { return kLeft + kPlotW * t / right; };
  auto y_of = [&](double l) { return kTop + kPlotH - kPlotH * l / top; };
  for (std::size_t k = 0; k < series.size(); ++k) {
    const LossSeries& s = series[k];
    const char* colour = kSeriesColours[k % std::size(kSeriesColours)];
    std::string points;
    for (std::size_t e = 0; e < s.loss.size() && e < s.seconds.size(); ++e) {
      if (!std::isfinite(s.loss[e])) continue;  // a diverged epoch: no point
      points += (points.empty() ? "" : " ") + fixed(x_of(s.seconds[e]), 1) + "," + fixed(y_of(s.loss[e]), 1);
      svg.o << "<circle cx=\"" << fixed(x_of(s.seconds[e]), 1) << "\" cy=\"" << fixed(y_of(s.loss[e]), 1)
            << "\" r=\"3\" fill=\"" << colour << "\"><title>" << escape(s.label) << ", epoch " << e + 1 << ": loss "
            << fixed(s.loss[e], 4) << " at " << fixed(s.seconds[e], 2) << " s</title></circle>\n";
    }
    svg.o << "<polyline points=\"" << points << "\" fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\"/>\n";
    svg.legend(static_cast<int>(k), colour, s.label);
  }
  if (target > 0 && target <= top)
    svg.o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + kPlotW << "\" y1=\"" << fixed(y_of(target), 1) << "\" y2=\""
          << fixed(y_of(target), 1) << "\" stroke=\"" << kIdeal << "\" stroke-dasharray=\"4 2\"><title>target loss "
          << fixed(target, 4) << "</title></line>\n";
  svg.x_title("seconds of training (loss at each epoch's end)");
  return svg.done();
}

std::vector<double> cumulative(const std::vector<double>& seconds) {
  std::vector<double> out;
  double sum = 0;
  for (double s : seconds) out.push_back(sum += s);
  return out;
}

// The what-if model's efficiency at 1, 2, 4, ... workers, with the runs' measured
// efficiency (against the run at one worker of as many replicas) on it.
std::string curve_chart(const Report& r) {
  Svg svg("Predicted scaling efficiency");
  svg.y_axis(100, "%", 0);
  const double n = static_cast<double>(r.curve.size());
  std::string line;
  for (std::size_t i = 0; i < r.curve.size(); ++i) {
    const Prediction& p = r.curve[i];
    const double x = kLeft + kPlotW * (n > 1 ? static_cast<double>(i) / (n - 1) : 0.5);
    const double y = kTop + kPlotH - kPlotH * std::min(1.0, p.efficiency);
    line += (i ? " " : "") + fixed(x, 1) + "," + fixed(y, 1);
    svg.o << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"4\" fill=\"" << kPredicted << "\"><title>"
          << p.workers << " workers: " << detail::percent(p.efficiency, 0) << ", " << fixed(p.samples_per_second, 0)
          << " samples/s</title></circle>\n";
    svg.x_label(x, std::to_string(p.workers));
  }
  svg.o << "<polyline points=\"" << line << "\" fill=\"none\" stroke=\"" << kPredicted << "\" stroke-width=\"2\"/>\n";
  svg.legend(0, kPredicted, "model");
  bool measured = false;
  for (const ScaleRun& run : r.runs) {
    const auto one = std::find_if(r.runs.begin(), r.runs.end(), [&](const ScaleRun& o) {
      return o.workers == 1 && o.replicas == run.replicas && o.samples_per_second > 0;
    });
    if (one == r.runs.end()) continue;
    // Where the run's worker count sits on the curve's axis (1, 2, 4, ..., the what-if's).
    for (std::size_t i = 0; i < r.curve.size(); ++i) {
      if (r.curve[i].workers != run.workers) continue;
      const double efficiency = run.samples_per_second / (one->samples_per_second * run.workers);
      const double x = kLeft + kPlotW * (n > 1 ? static_cast<double>(i) / (n - 1) : 0.5);
      svg.o << "<circle cx=\"" << fixed(x, 1) << "\" cy=\"" << fixed(kTop + kPlotH - kPlotH * std::min(1.0, efficiency), 1)
            << "\" r=\"5\" fill=\"" << kMeasured << "\"><title>measured, " << label(run) << ": "
            << detail::percent(efficiency, 0) << "</title></circle>\n";
      measured = true;
    }
  }
  if (measured) svg.legend(1, kMeasured, "measured");
  svg.x_title("workers");
  return svg.done();
}

// The doctor's markdown tables as HTML tables; other lines as paragraphs.
std::string markdown_html(const std::string& text) {
  std::ostringstream o;
  std::istringstream in(text);
  std::string line;
  bool in_table = false, header = false;
  while (std::getline(in, line)) {
    const bool row = !line.empty() && line.front() == '|';
    if (row && line.rfind("|---", 0) == 0) continue;
    if (row && !in_table) {
      o << "<table>\n";
      in_table = header = true;
    } else if (!row && in_table) {
      o << "</table>\n";
      in_table = false;
    }
    if (!row) {
      if (!line.empty()) o << "<p>" << escape(line) << "</p>\n";
      continue;
    }
    o << "<tr>";
    std::size_t at = 1;
    for (std::size_t next; (next = line.find('|', at)) != std::string::npos; at = next + 1) {
      std::string cell = line.substr(at, next - at);
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      o << (header ? "<th>" : "<td>") << escape(cell) << (header ? "</th>" : "</td>");
    }
    o << "</tr>\n";
    header = false;
  }
  if (in_table) o << "</table>\n";
  return o.str();
}

}  // namespace

std::string html_report(const Report& r) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << escape(r.title)
    << "</title>\n<style>\n"
       "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1320px;color:#222;padding:0 1em}\n"
       "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}\n"
       ".charts{display:flex;flex-wrap:wrap;gap:12px}\n"
       "svg{background:#fafafa;border:1px solid #ddd}\n"
       "svg .title{font-size:14px;font-weight:600}svg .tick{font-size:11px;fill:#444}svg .axis{font-size:12px;fill:#222}\n"
       "svg .grid{stroke:#e4e4e4}\n"
       "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
       "text-align:right}th{background:#f0f0f0}\n"
       "li{margin:.5em 0}.fix{color:#225a22}\n"
       "</style></head><body>\n<h1>"
    << escape(r.title) << "</h1>\n";
  if (!r.runs.empty()) {
    std::vector<LossSeries> losses;
    for (const ScaleRun& run : r.runs)
      if (!run.loss.empty()) losses.push_back({label(run), cumulative(run.epoch_seconds), run.loss});
    o << "<div class=\"charts\">\n" << throughput_chart(r) << efficiency_chart(r) << phases_chart(r);
    if (!losses.empty()) o << loss_chart("Loss against time, each scale", losses, 0);
    if (!r.curve.empty()) o << curve_chart(r);
    o << "</div>\n<h2>Scaling</h2>\n" << markdown_html(scaling_table(r.runs));
    if (!losses.empty())
      o << "<h2>Time to accuracy</h2>\n" << markdown_html(time_to_accuracy_table(r.runs, r.noise_scale))
        << markdown_html(batch_advice(r.runs, r.noise_scale));
  }
  if (!r.strategies.empty()) {
    std::vector<LossSeries> losses;
    for (const StrategyRun& run : r.strategies) losses.push_back({run.label, cumulative(run.epoch_seconds), run.loss});
    o << "<div class=\"charts\">\n" << loss_chart("Loss against time, each strategy", losses, r.target_loss)
      << "</div>\n<h2>Strategies</h2>\n" << markdown_html(strategies_table(r.strategies, r.target_loss)) << "<p>"
      << escape("Recommendation: " + recommend(r.strategies, r.target_loss).reason + ".") << "</p>\n";
  }
  if (r.runs.empty()) {  // a comparison of strategies has no diagnosis of scales
    o << "</body></html>\n";
    return o.str();
  }
  o << "<h2>Diagnosis</h2>\n";
  if (r.findings.empty()) o << "<p>" << escape(format_findings(r.findings)) << "</p>\n";
  o << "<ul>\n";
  for (const Finding& f : r.findings)
    o << "<li><b>" << escape(f.cause) << "</b>: " << escape(f.evidence) << ".<br><span class=\"fix\">Fix: "
      << escape(f.fix) << ".</span></li>\n";
  o << "</ul>\n";
  if (!r.checks.empty())
    o << "<h2>Model check</h2>\n<p>" << escape(capitalized(model_check_heading(r.link))) << ".</p>\n"
      << markdown_html(model_check_table(r.checks));
  if (!r.what_if.empty()) o << "<h2>What if</h2>\n" << markdown_html(r.what_if);
  o << "</body></html>\n";
  return o.str();
}

}  // namespace dtrain::profile
