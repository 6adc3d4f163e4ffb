#include "tools/kiln-inspect/loss_plot.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tools/kiln-inspect/xml_text.h"

namespace kiln {
namespace {

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (step, loss)
};

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1,
// column 21: " (the caller says where).
std::string json_problem(const nlohmann::json::exception& e) {
  std::string what = e.what();
  if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
  if (what.compare(0, 15, "parse error at ") == 0)
    if (const size_t at = what.find(": "); at != std::string::npos) what = what.substr(at + 2);
  return what;
}

struct Tick {
  double value;
  std::string label;
};

// Round values in [lo, hi] for an axis: the multiples of 1, 2 or 5 times a power of ten that
// give 2 to 7 ticks (whole numbers when `whole`), labelled with as many decimals as the step
// has. Values a label cannot hold so (beyond 1e12: a log from elsewhere) get six evenly spaced
// ticks in three significant digits.
std::vector<Tick> round_ticks(double lo, double hi, bool whole) {
  std::vector<Tick> ticks;
  char text[64];
  const double span = hi - lo;
  if (std::isfinite(span) && span > 0 && std::fabs(lo) < 1e12 && std::fabs(hi) < 1e12) {
    double step = std::pow(10.0, std::floor(std::log10(span / 5)));  // span / step in [5, 50)
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (span / (m * step) <= 6) {
        step *= m;
        break;
      }
    if (whole) step = std::max(step, 1.0);
    const int decimals = whole ? 0 : std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
    for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; ++k) {
      const double v = k * step;
      std::snprintf(text, sizeof text, "%.*f", decimals, v == 0 ? 0.0 : v);  // (never "-0")
      ticks.push_back({v, text});
    }
    if (ticks.size() >= 2) return ticks;
    ticks.clear();
  }
  for (int i = 0; i <= 5; ++i) {
    const double f = i / 5.0, v = lo * (1 - f) + hi * f;
    std::snprintf(text, sizeof text, "%.3g", v);
    ticks.push_back({v, text});
  }
  return ticks;
}

}  // namespace

std::string loss_plot_svg(const std::vector<std::string>& logs) {
  std::vector<Series> series;
  for (const std::string& path : logs) {
    check_not_a_device(path);  // /dev/zero would be one endless line
    if (std::error_code ec; std::filesystem::is_directory(path, ec)) throw Error(path + ": is a folder; give a --log file");
    if (::access(path.c_str(), R_OK) != 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open");
    // A fresh run appended to a log (its first line has "start": "fresh") is a run of its own.
    // A resumed one ("start": "resume", at the step after its checkpoint's) continues the latest
    // run that got that far, and the last record of a step wins.
    struct Run {
      std::map<double, double> train, val;
      bool empty() const { return train.empty() && val.empty(); }
      double last() const { return train.empty() ? -1e300 : train.rbegin()->first; }
    };
    std::vector<Run> runs(1);
    size_t at = 0;  // the run the lines go to
    std::string line;
    int cut = 0;  // records cut short (a run killed while writing one), left out
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() && line.compare(0, 2, "{\"") == 0) {
        // A record cut short (a run killed while writing it) fails at its end; one that fails
        // before (a NaN, 1e999: what kiln-run never writes) is no log's.
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          if (e.byte > line.size()) {
            ++cut;
            continue;
          }
          throw Error(path + ":" + std::to_string(n) + ":" + std::to_string(e.byte) + ": not a training log record: " +
                      json_problem(e));
        } catch (const nlohmann::json::exception& e) {
          throw Error(path + ":" + std::to_string(n) + ": not a training log record: " + json_problem(e));
        }
      }
      if (j.is_discarded() || !j.is_object() || !j.contains("step"))
        throw Error(path + ":" + std::to_string(n) + ": not a training log record (JSON with \"step\")");
      if (!j["step"].is_number() || !std::isfinite(j["step"].get<double>()))
        throw Error(path + ":" + std::to_string(n) + ": \"step\" is " + j["step"].dump() + ", not a finite number");
      const double step = j["step"].get<double>();
      // kiln-run writes a NaN loss as null (JSON has no NaN): that is skipped, anything else is not a log's.
      for (const char* key : {"loss", "val_loss"})
        if (j.contains(key) && !j[key].is_number() && !j[key].is_null())
          throw Error(path + ":" + std::to_string(n) + ": \"" + key + "\" is " + j[key].dump() + ", not a number");
      if (j.contains("start") && j["start"] != "fresh" && j["start"] != "resume")
        throw Error(path + ":" + std::to_string(n) + ": \"start\" is " + j["start"].dump() + ", not \"fresh\" or \"resume\"");
      if (j.contains("start") && j["start"] == "fresh" && !runs.back().empty()) {
        runs.emplace_back();
        at = runs.size() - 1;
      } else if (j.contains("start") && j["start"] == "resume") {
        at = runs.size() - 1;  // when none got that far (its run's lines are in another log)
        for (size_t r = runs.size(); r-- > 0;)
          if (runs[r].last() >= step - 1) {
            at = r;
            break;
          }
      }
      if (j.contains("loss") && j["loss"].is_number()) runs[at].train[step] = j["loss"].get<double>();
      if (j.contains("val_loss") && j["val_loss"].is_number()) runs[at].val[step] = j["val_loss"].get<double>();
    }
    if (cut) std::fprintf(stderr, "note: %s: %d record%s cut short (a run killed while writing) left out\n", path.c_str(),
                          cut, cut == 1 ? "" : "s");
    bool any = false;
    for (size_t r = 0; r < runs.size(); ++r) {
      const std::string name = runs.size() > 1 ? path + ", run " + std::to_string(r + 1) : path;
      for (auto [by_step, what] : {std::pair{&runs[r].train, " (train)"}, std::pair{&runs[r].val, " (val)"}}) {
        if (by_step->empty()) continue;
        series.push_back({name + what, {by_step->begin(), by_step->end()}});
        any = true;
      }
    }
    if (!any) throw Error(path + ": no loss records");
  }

  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  // Halves, so that the spans of values near the largest double stay finite.
  const double pad = (y1 / 2 - y0 / 2) * 0.1, big = std::numeric_limits<double>::max();
  y0 = std::max(y0 - pad, -big), y1 = std::min(y1 + pad, big);

  const double W = 900, H = 540, L = 70, R = 20, T = 40, Bm = 50;
  auto px = [&](double x) { return L + (x / 2 - x0 / 2) / (x1 / 2 - x0 / 2) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 / 2 - y / 2) / (y1 / 2 - y0 / 2) * (H - T - Bm); };
  std::string svg;
  char buf[512];
  auto add = [&](const char* fmt, auto... a) { std::snprintf(buf, sizeof buf, fmt, a...), svg += buf; };
  add("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  add("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"24\" font-size=\"15\">loss</text>\n", L);
  // Grid lines and tick labels at round values (steps at whole numbers).
  for (const Tick& t : round_ticks(y0, y1, false)) {
    add("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, py(t.value), W - R, py(t.value));
    add("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", L - 6, py(t.value) + 4);
    svg += t.label + "</text>\n";
  }
  for (const Tick& t : round_ticks(x0, x1, true)) {
    add("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", px(t.value), H - Bm + 18);
    svg += t.label + "</text>\n";
  }
  add("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 12);
  // Ten colours, then the same dashed (a series keeps its own look up to 20).
  const char* colours[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1",
                           "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac"};
  constexpr size_t kColours = sizeof colours / sizeof colours[0];
  for (size_t i = 0; i < series.size(); ++i) {
    std::string pts;
    for (auto [x, y] : series[i].points)
      if (std::isfinite(y)) std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y)), pts += buf;
    svg += "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" + std::string(colours[i % kColours]) + "\"" +
           ((i / kColours) % 2 ? " stroke-dasharray=\"6 3\"" : "") + " points=\"" + pts + "\"/>\n";
    // A sparse series (validation every N steps; a single point draws no line) gets a dot per point.
    if (series[i].points.size() <= 50)
      for (auto [x, y] : series[i].points)
        if (std::isfinite(y)) add("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(x), py(y), colours[i % kColours]);
    add("<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", W - R - 340, T + 16 + 16.0 * i, colours[i % kColours]);
    svg += xml_escaped(series[i].label) + "</text>\n";
  }
  return svg + "</svg>\n";
}

}  // namespace kiln
