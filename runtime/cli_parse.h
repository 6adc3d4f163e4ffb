// Command-line pieces shared by Kiln's tools (CLI11): number checks with plain messages, and
// parsing that reports a bad command line as one line.
#pragma once

#include <CLI/CLI.hpp>
#include <type_traits>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace kiln::cli {

// A whole number in plain decimal within [min, max] of the type T the option is stored in, with
// an optional sign (+3 as the float options take +0.5). CLI11 alone reads 010 as octal 8 and 0x10
// as 16, an unsigned "-1" as 2^64-1, saturates 2^64, and its ranges print their bounds as doubles
// (1.797693e+308).
template <class T>
using Bound = typename std::common_type<T>::type;  // T, not deduced: whole(0, 1) checks an int64_t's text
template <class T = int64_t>
CLI::Validator whole(Bound<T> min, Bound<T> max = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= sizeof(uint64_t));
  return CLI::Validator(
      [min, max](std::string& s) {
        const size_t first = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
        const bool digits = s.size() > first && s.find_first_not_of("0123456789", first) == std::string::npos;
        const bool leading_zero = digits && s.size() > first + 1 && s[first] == '0';
        const std::string range = max == std::numeric_limits<T>::max()
                                      ? ">= " + std::to_string(min)
                                      : "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
        // The digits' magnitude; past 64 bits, 2^64 stands for it (every T's bounds lie within +-2^64).
        uint64_t magnitude = 0;
        const std::errc err = digits ? std::from_chars(s.data() + first, s.data() + s.size(), magnitude).ec
                                     : std::errc::invalid_argument;
        if (!digits || leading_zero || (err != std::errc() && err != std::errc::result_out_of_range))
          return "Value " + s + " is not a whole number " + range + (leading_zero ? " (no leading zeros)" : "");
        const bool negative = s[0] == '-';
        const __int128 past = err == std::errc::result_out_of_range ? __int128(1) << 64 : __int128(magnitude);
        const __int128 v = negative ? -past : past;
        if (v > __int128(max))
          return "Value " + s + " is too large (a whole number " +
                 (max == std::numeric_limits<T>::max() ? "at most " + std::to_string(max) : range) + ")";
        if (v < __int128(min)) return "Value " + s + " is too small (a whole number " + range + ")";
        if (first && (!negative || magnitude == 0)) s.erase(0, 1);  // the option reads the digits alone
        return std::string();
      },
      uint64_t(max) >= uint64_t(INT32_MAX) ? "" : "[" + std::to_string(min) + ", " + std::to_string(max) + "]");  // --help: INT:[0, 1]
}

// Decimal digits with an optional sign, point and exponent (1, -2.5, .5, 3e-4), and nothing
// else: CLI11 reads numbers with strtod, which also takes hex (0x10 is 16), " 1" and "1 ".
inline bool plain_decimal(const std::string& s) {
  size_t i = 0, digits = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) ++digits;
  if (i < s.size() && s[i] == '.')
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) ++digits;
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    if (++i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t first = i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {}
    if (i == first) return false;
  }
  return i == s.size();
}

// A finite number in plain decimal, parsed as the T it is stored in (so a float refuses 1e39, inf,
// and 1e-50, 0), that passes `ok`: else "Value S is not WHAT". CLI11's PositiveNumber,
// NonNegativeNumber and Range let NaN through and take infinity. `name` shows in --help.
template <class T, class Ok>
CLI::Validator number(Ok ok, std::string what, std::string name = "") {
  return CLI::Validator(
      [ok, what](std::string& s) {
        T v = 0;
        const bool parsed = CLI::detail::lexical_cast(s, v);
        if (parsed && std::isfinite(v) && !plain_decimal(s))  // (0x10, " 1")
          return "Value \"" + s + "\" is not " + what + " in decimal digits";
        if (!parsed || !std::isfinite(v) || !ok(v)) {
          // A float that rounds onto a bound (0.999999999 is 1) says so: the digits alone pass.
          double wide = 0;
          std::string rounded;
          if (std::is_same_v<T, float> && CLI::detail::lexical_cast(s, wide) && std::isfinite(wide) && double(v) != wide)
            rounded = " (" + CLI::detail::to_string(double(v)) + " as the 32-bit float it is kept in)";
          const bool spaced = s.find_first_of(" \t") != std::string::npos;
          return "Value " + (spaced ? "\"" + s + "\"" : s) + rounded + " is not " + what;
        }
        return std::string();
      },
      name);
}

inline CLI::Validator non_negative_finite() {
  return number<double>([](double v) { return v >= 0; }, "a finite number >= 0");
}
inline CLI::Validator positive_finite() {
  return number<double>([](double v) { return v > 0; }, "a positive finite number");
}
// For a value kept in a float (a hyperparameter the step reads, a size): 1e-50 is 0 there.
inline CLI::Validator positive_finite_float() {
  return number<float>([](float v) { return v > 0; }, "a positive finite number", "POSITIVE");
}
inline CLI::Validator finite_in(double lo, double hi) {
  return number<double>([lo, hi](double v) { return v >= lo && v <= hi; },
                        "a number in [" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "]");
}

// A value that is not "" (an empty file or folder name would otherwise be taken as not given).
inline CLI::Validator non_empty() {
  return CLI::Validator([](std::string& s) { return s.empty() ? std::string("needs a name, got \"\"") : std::string(); }, "");
}

// Edit distance with adjacent transpositions (optimal string alignment): insertions, deletions,
// substitutions and swaps of single characters ("--stesp" is 1 from "--steps").
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The exit code after --help or --version: 1 when stdout could not take the text (a full disk, a
// closed pipe), which a script checking the status would otherwise take for printed help.
inline int help_printed(const CLI::App& app, int code) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
  const int err = errno;
  std::fprintf(stderr, "error: %s: stdout: writing the help failed: %s\n",
               std::filesystem::path(app.get_name()).filename().string().c_str(), std::strerror(err));
  return 1;
}

// Parses the command line. Returns -1 to go on, or the exit code: 0 after --help, 2 after a bad
// command line, reported as one line naming the tool ("error: --steps: ... (see kilnc --help)").
// A launched rank names itself in the error (`rank`: "rank 1 of 2: "). One whose command line
// every rank shares (`defer_to_root`) leaves the help to rank 0, and its error too: mpirun ends
// the job at rank 0's failing exit, so this one says it only if still running 10 s later (rank 0
// started late, or was given another line after all).
inline constexpr int kDeferToRootSeconds = 10;  // (also a shared command's start-up errors: cli.cpp)
inline int parse(CLI::App& app, int argc, char** argv, const std::string& rank = "", bool defer_to_root = false) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp& e) {
    return defer_to_root ? 0 : help_printed(app, app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return defer_to_root ? 0 : help_printed(app, app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return defer_to_root ? 0 : help_printed(app, app.exit(e));
  } catch (const CLI::ParseError& e) {
    if (defer_to_root) std::this_thread::sleep_for(std::chrono::seconds(kDeferToRootSeconds));
    std::string tool = std::filesystem::path(app.get_name()).filename().string();  // argv[0] when unnamed
    // The command and the subcommands parsed under it, outermost first.
    std::vector<const CLI::App*> chain{&app};
    for (bool deeper = true; deeper;) {
      deeper = false;
      for (const CLI::App* s : chain.back()->get_subcommands())
        if (s->parsed()) {
          chain.push_back(s);
          deeper = true;
          break;
        }
    }
    // The help that lists the option: the subcommand's ("see gpt2 train --help").
    // (kiln-run takes the module before the subcommand: "see kiln-run MODULE train --help", since
    // "kiln-run train --help" would show kiln-run's own help.)
    if (chain.size() > 1 && app.get_option_no_throw("module") != nullptr) tool += " MODULE";
    for (size_t i = 1; i < chain.size(); ++i) tool += " " + chain[i]->get_name();
    std::string what = e.what();
    // A misspelt subcommand is left over as an extra word: name it, and the subcommands there are.
    if (what == "A subcommand is required")
      for (const std::string& word : app.remaining())
        if (!word.empty() && word[0] != '-') {
          std::string names;
          for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
            names += (names.empty() ? "" : ", ") + sub->get_name();
          what = "unknown subcommand '" + word + "' (" + names + ")";
          break;
        }
    if (what == "A subcommand is required") {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      what = "a subcommand is required: " + names;
    }
    // CLI11 checks required options before it reports unknown ones: a misspelt option
    // ("--inti") would hide behind "--init is required".
    if (dynamic_cast<const CLI::RequiredError*>(&e) && what == e.what())  // (not a misspelt subcommand)
      for (const std::string& word : app.remaining(true))
        if (word.size() > 1 && word[0] == '-') {
          what = "The following argument was not expected: " + word;  // as CLI11 says it otherwise
          break;
        }
    // A misspelt option: the nearest one the command (or a command above it) has, when it is near:
    // 1 edit for a name of up to 3 letters, else 2. CLI11 lists what it did not expect, values
    // too ("3 --stesp"): the first word that looks like an option is taken.
    for (const char* lead : {"The following argument was not expected: ", "The following arguments were not expected: "}) {
      if (what.rfind(lead, 0) != 0) continue;
      std::string word;
      std::istringstream words(what.substr(std::string(lead).size()));
      for (std::string w; words >> w;)
        if (w.size() > 1 && w[0] == '-') {
          word = w.substr(0, w.find('='));  // "--step=2"
          break;
        }
      const size_t letters = word.size() - std::min<size_t>(word.find_first_not_of('-'), word.size());
      const size_t most = letters <= 3 ? 1 : 2;
      std::string best;
      size_t best_d = most + 1;
      for (auto it = chain.rbegin(); it != chain.rend() && !word.empty(); ++it)
        for (const CLI::Option* opt : (*it)->get_options())
          for (const std::string& name : opt->get_lnames())
            if (const size_t d = edit_distance(word, "--" + name); d < best_d) best = "--" + name, best_d = d;
      if (!best.empty()) what += "; did you mean " + best + "?";
    }
    // A required option with a short name too is named by both ("-o,--output is required"), as the
    // help's option list shows it.
    if (dynamic_cast<const CLI::RequiredError*>(&e))
      for (const CLI::App* sub : chain)
        for (const CLI::Option* opt : sub->get_options())
          if (what == opt->get_name() + " is required" && !opt->get_snames().empty())
            what = opt->get_name(false, true) + " is required";
    // CLI11's word for an option given twice.
    if (const size_t at = what.find("At Most 1 required but received "); at != std::string::npos)
      what = what.substr(0, at) + "given " + what.substr(at + 32) + " times; give it once";
    std::fprintf(stderr, "error: %s%s (see %s --help)\n", rank.c_str(), one_line(what).c_str(), tool.c_str());
    return 2;
  }
}

}  // namespace kiln::cli
