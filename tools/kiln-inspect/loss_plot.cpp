#include "tools/kiln-inspect/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/params.h"
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

// Ticks for an axis over [lo, hi]: the multiples of 1, 2 or 5 times a power of ten that give 2 to
// 7 of them (whole numbers when `whole`); where no such multiples exist as distinct doubles (a
// span of a few ulps, a log from elsewhere), six evenly spaced values. Labels: fixed decimals,
// as many as the step has, for ordinary values; else the fewest significant digits (at least 3)
// that tell every tick apart.
std::vector<Tick> round_ticks(double lo, double hi, bool whole) {
  std::vector<double> values;
  double step = 0;
  const double span = hi - lo;
  if (std::isfinite(span) && span > 0) {
    step = std::pow(10.0, std::floor(std::log10(span / 5)));  // span / step in [5, 50)
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (span / (m * step) <= 6) {
        step *= m;
        break;
      }
    if (whole) step = std::max(step, 1.0);
    const double first = std::ceil(lo / step - 1e-9);
    // k * step are distinct doubles while k is far below 2^53; 8 at most (the loop's bound).
    if (std::isfinite(first) && std::fabs(first) < 1e15)
      for (double k = first; k * step <= hi + step * 1e-9 && values.size() <= 7; ++k) values.push_back(k * step);
    if (values.size() < 2 || values.size() > 7) values.clear();
  }
  const bool evenly = values.empty();
  if (evenly) {
    for (int i = 0; i <= 5; ++i) values.push_back(lo * (1 - i / 5.0) + hi * (i / 5.0));
    std::sort(values.begin(), values.end());  // (a span of a few ulps rounds them out of order)
    values.erase(std::unique(values.begin(), values.end()), values.end());
  }

  std::vector<Tick> ticks;
  char text[64];
  double largest = 0;
  for (double v : values) largest = std::max(largest, std::fabs(v));
  if (!evenly && step >= 1e-4 && largest < 1e7) {
    const int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
    for (double v : values) {
      std::snprintf(text, sizeof text, "%.*f", decimals, v == 0 ? 0.0 : v);  // (never "-0")
      ticks.push_back({v, text});
    }
    return ticks;
  }
  for (int digits = 3; digits <= 17; ++digits) {
    ticks.clear();
    for (double v : values) {
      std::snprintf(text, sizeof text, "%.*g", digits, v == 0 ? 0.0 : v);
      ticks.push_back({v, text});
    }
    bool distinct = true;
    for (size_t i = 1; i < ticks.size(); ++i) distinct &= ticks[i].label != ticks[i - 1].label;
    if (distinct) break;
  }
  return ticks;
}

}  // namespace

std::string loss_plot_svg(const std::vector<std::string>& logs) {
  std::vector<Series> series;
  for (const std::string& path : logs) {
    if (std::error_code ec; std::filesystem::is_directory(path, ec)) throw Error(path + ": is a folder; give a --log file");
    // (read_file refuses a device such as /dev/zero, one endless line, and a FIFO no one writes to)
    // A file Kiln knows of another kind (a module, weights, a checkpoint, a shard) is named as such.
    if (const std::string kind = file_kind(path); !kind.empty())
      throw Error(path + ": is " + kind + ", not a training log (the JSON lines kiln-run train --log writes)");
    const std::vector<uint8_t> bytes = read_file(path);
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
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
      // kiln-run --profile's record (the table of a run's kernel times) draws nothing.
      if (j.is_object() && j.contains("profile") && !j.contains("step")) continue;
      if (j.is_discarded() || !j.is_object() || !j.contains("step"))
        throw Error(path + ":" + std::to_string(n) + ": not a training log record (JSON with \"step\")");
      // kiln-run logs whole step numbers from 0; up to 2^53 each is a distinct double (an integer
      // past it is refused before it rounds to one).
      const auto& s = j["step"];
      const double step = s.is_number_unsigned() && s.get<uint64_t>() > (uint64_t(1) << 53) ? NAN
                          : s.is_number()                                                  ? s.get<double>()
                                                                                           : NAN;
      if (!(step >= 0 && step <= 9007199254740992.0 && step == std::floor(step)))
        throw Error(path + ":" + std::to_string(n) + ": \"step\" is " + j["step"].dump() +
                    ", not a step number (a whole number from 0 to 2^53)");
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

  const double inf = std::numeric_limits<double>::infinity();
  double x0 = inf, x1 = -inf, y0 = inf, y1 = -inf;
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // no finite point (nothing is drawn)
  // The picture divides by hi/2 - lo/2 (halves, so that the spans of values near the largest
  // double stay finite): one value, or a span that halving rounds away (subnormals), is widened
  // by no rounding of it (+1 is nothing to 1e17), downwards near the largest double.
  auto widen = [](double& lo, double& hi) {
    if (hi / 2 > lo / 2) return;
    const double d = std::max(1.0, std::fabs(lo) * 1e-3);
    if (std::isfinite(lo + d)) hi = lo + d;
    else lo = hi - d;
  };
  widen(x0, x1);
  widen(y0, y1);
  const double pad = (y1 / 2 - y0 / 2) * 0.1, big = std::numeric_limits<double>::max();
  y0 = std::max(y0 - pad, -big), y1 = std::min(y1 + pad, big);

  const std::vector<Tick> yticks = round_ticks(y0, y1, false), xticks = round_ticks(x0, x1, true);
  // Margins wide enough for the labels (about 7 px a character at 12 px): the y labels end left
  // of the plot, the last x label is centred on its right edge.
  size_t ylabel = 0;
  for (const Tick& t : yticks) ylabel = std::max(ylabel, t.label.size());
  const double W = 900, H = 540, T = 40, Bm = 50;
  const double L = std::max(70.0, 14.0 + 7.0 * double(ylabel)), R = std::max(20.0, 4.0 + 3.5 * double(xticks.back().label.size()));
  auto px = [&](double x) { return L + (x / 2 - x0 / 2) / (x1 / 2 - x0 / 2) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 / 2 - y / 2) / (y1 / 2 - y0 / 2) * (H - T - Bm); };
  std::string svg;
  char buf[512];
  auto add = [&](const char* fmt, auto... a) { std::snprintf(buf, sizeof buf, fmt, a...), svg += buf; };
  add("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  add("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"24\" font-size=\"15\">loss</text>\n", L);
  // Grid lines and tick labels at round values (steps at whole numbers).
  for (const Tick& t : yticks) {
    add("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, py(t.value), W - R, py(t.value));
    add("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", L - 6, py(t.value) + 4);
    svg += t.label + "</text>\n";
  }
  for (const Tick& t : xticks) {
    add("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", px(t.value), H - Bm + 18);
    svg += t.label + "</text>\n";
  }
  add("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step (from 0, as logged)</text>\n", (L + W - R) / 2, H - 12);
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
