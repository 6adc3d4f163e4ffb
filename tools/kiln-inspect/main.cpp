// kiln-inspect: reports on a module or a training executable (text, or --json).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "runtime/cli_parse.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/replaceable_output.h"
#include "runtime/module.h"
#include "runtime/version.h"
#include "tools/kiln-inspect/cuda_report.h"
#include "tools/kiln-inspect/fusion_report.h"
#include "tools/kiln-inspect/program_graph.h"
#include "tools/kiln-inspect/loss_plot.h"
#include "tools/kiln-inspect/memory_report.h"
#include "tools/kiln-inspect/roofline_report.h"

using namespace kiln;
using nlohmann::ordered_json;

namespace {

// The usage line names the plot subcommand too: it is parsed before this App (its own help is
// `kiln-inspect plot --help`), so CLI11 does not know of it.
struct UsageWithPlot : CLI::Formatter {
  std::string make_usage(const CLI::App* app, std::string name) const override {
    return CLI::Formatter::make_usage(app, name) + "   or: " + name + " plot [OPTIONS] logs...\n";
  }
};

ordered_json report(const Module& m, const RooflineRates& rates) {
  const fb::Module& f = m.fb();
  const fb::Model& model = *f.model();
  ordered_json j;
  j["module"] = m.source();
  j["format_version"] = f.format_version();
  j["compiler"] = f.compiler() ? f.compiler()->str() : "";
  j["model"] = {{"spec", model.spec() ? model.spec()->str() : ""},
                {"n_layer", model.n_layer()}, {"n_head", model.n_head()},
                {"n_embd", model.n_embd()}, {"vocab_size", model.vocab_size()},
                {"block_size", model.block_size()}, {"batch_size", model.batch_size()},
                {"seq_len", model.seq_len()},
                {"precision", model.precision() ? model.precision()->str() : ""},
                {"target", model.target() ? model.target()->str() : ""}};
  int64_t count = 0;
  ordered_json params = ordered_json::array();
  for (const fb::Parameter* p : *f.parameters()) {
    count += numel(m.buffer(p->value()));
    params.push_back({{"name", p->name()->str()},
                      {"shape", std::vector<int64_t>(p->shape()->begin(), p->shape()->end())},
                      {"decay", p->decay()}});
  }
  j["parameter_count"] = count;
  j["parameters"] = params;
  ordered_json programs = ordered_json::array();
  for (const fb::Program* p : *f.programs()) {
    std::map<std::string, int> ops;
    for (const fb::Instr* ins : *p->instrs()) ops[fb::EnumNameOpCode(ins->op())]++;
    programs.push_back({{"name", p->name()->str()}, {"instrs", p->instrs()->size()}, {"ops", ops}});
  }
  j["programs"] = programs;
  // Where each activation is live: per program that uses it, its first and last instr (what
  // the plan verifier checks: buffers live at once do not share bytes). By kind and dtype below:
  // the state, and the activations of the program that uses the most (each program has its own:
  // forward and logits repeat micro_step's forward, sample's caches are 3).
  std::vector<ordered_json> live(f.buffers()->size(), ordered_json::array());
  const fb::Program* most = nullptr;
  std::set<uint32_t> most_uses;
  uint64_t most_bytes = 0;
  for (const fb::Program* p : *f.programs()) {
    const auto kept = m.kept_buffers(*p);  // (key/value caches: live from one run to the next)
    std::set<uint32_t> uses;
    uint64_t sum = 0;
    const std::vector<Span> spans = spans_of(m, *p);
    // A buffer at the offset of one whose last instruction is its first is written in place of
    // it, by that instruction (the planner otherwise gives an offset only once it is free).
    std::map<std::pair<uint64_t, int64_t>, uint32_t> ending;  // (offset, last instr) -> buffer
    for (const Span& s : spans) ending[{m.buffer(s.buffer).offset(), s.last}] = s.buffer;
    for (const Span& s : spans) {
      uses.insert(s.buffer);
      sum += m.buffer(s.buffer).size();
      ordered_json l = {{"program", p->name()->str()}, {"first_instr", s.first}, {"last_instr", s.last},
                        {"kept_between_runs", std::find(kept.begin(), kept.end(), s.buffer) != kept.end()}};
      if (auto it = ending.find({m.buffer(s.buffer).offset(), s.first}); it != ending.end() && it->second != s.buffer)
        l["in_place_of"] = it->second;
      live[s.buffer].push_back(std::move(l));
    }
    if (!most || sum > most_bytes) most = p, most_uses = std::move(uses), most_bytes = sum;
  }
  std::map<std::string, uint64_t> bytes, by_dtype;
  ordered_json list = ordered_json::array();
  for (uint32_t i = 0; i < f.buffers()->size(); ++i) {
    const fb::Buffer* b = f.buffers()->Get(i);
    if (b->kind() != fb::BufferKind::Activation || most_uses.count(i)) {
      bytes[fb::EnumNameBufferKind(b->kind())] += b->size();
      by_dtype[fb::EnumNameDType(b->dtype())] += b->size();
    }
    list.push_back({{"name", b->name() ? b->name()->str() : ""}, {"kind", fb::EnumNameBufferKind(b->kind())},
                    {"dtype", fb::EnumNameDType(b->dtype())},
                    {"shape", std::vector<int64_t>(b->shape()->begin(), b->shape()->end())},
                    {"offset", b->offset()}, {"bytes", b->size()}, {"live", live[i]}});
  }
  j["buffers"] = {{"count", f.buffers()->size()}, {"activations_of", most ? most->name()->str() : ""},
                  {"bytes_by_kind", bytes}, {"bytes_by_dtype", by_dtype}, {"list", list}};
  add_memory_report(m, j);
  add_fusion_report(m, j);
  add_cuda_report(m, j);
  add_roofline_report(m, rates, j);
  return j;
}


void print_buffers(const ordered_json& j) {
  // The plan IR's kiln.offsets count from the activations' start: said, so the two can be matched.
  std::printf("(offsets: bytes from the arena's start; the state comes first, so an activation's offset is %llu + "
              "its kiln.offsets in the plan IR)\n", (unsigned long long)j["state_bytes"].get<uint64_t>());
  std::printf("%-6s %-44s %-12s %-5s %14s %12s  %-14s  live (program: instrs)\n", "index", "buffer", "kind", "dtype",
              "offset", "bytes", "shape");
  int i = 0;
  for (const auto& b : j["buffers"]["list"]) {
    std::string shape, live;
    for (const auto& d : b["shape"]) shape += (shape.empty() ? "" : "x") + std::to_string(d.get<int64_t>());
    for (const auto& l : b["live"])
      live += (live.empty() ? "" : ", ") + l["program"].get<std::string>() + ": " +
              (l["kept_between_runs"].get<bool>() ? "every instr, kept between runs (used at " : "") +
              std::to_string(l["first_instr"].get<int64_t>()) + ".." + std::to_string(l["last_instr"].get<int64_t>()) +
              (l["kept_between_runs"].get<bool>() ? ")" : "") +
              (l.contains("in_place_of") ? " (in place of " + l["in_place_of"].dump() + ")" : "");
    if (b["kind"] != "Activation") live = "whole run (state)";
    std::printf("%-6d %-44s %-12s %-5s %14llu %12llu  %-14s  %s\n", i++, b["name"].get<std::string>().c_str(),
                b["kind"].get<std::string>().c_str(), b["dtype"].get<std::string>().c_str(),
                (unsigned long long)b["offset"].get<uint64_t>(), (unsigned long long)b["bytes"].get<uint64_t>(),
                shape.empty() ? "scalar" : shape.c_str(), live.c_str());
  }
}

void print_text(const ordered_json& j) {
  const auto& m = j["model"];
  std::printf("module     %s (format %d, %s)\n", j["module"].get<std::string>().c_str(),
              j["format_version"].get<int>(), j["compiler"].get<std::string>().c_str());
  std::printf("model      %s: L=%d H=%d C=%d V=%d Tmax=%d\n", m["spec"].get<std::string>().c_str(),
              m["n_layer"].get<int>(), m["n_head"].get<int>(), m["n_embd"].get<int>(),
              m["vocab_size"].get<int>(), m["block_size"].get<int>());
  std::printf("compiled   B=%d T=%d %s %s\n", m["batch_size"].get<int>(), m["seq_len"].get<int>(),
              m["precision"].get<std::string>().c_str(), m["target"].get<std::string>().c_str());
  // The token embedding's rows past V pad the vocabulary (to a multiple of 128: GPT-2's 50304);
  // they get no gradient, and are left out of the model's usual count.
  int64_t padded = 0;
  for (const auto& p : j["parameters"])
    if (p["name"] == "wte.weight" && p["shape"].size() == 2)
      padded = (p["shape"][0].get<int64_t>() - m["vocab_size"].get<int64_t>()) * p["shape"][1].get<int64_t>();
  const int64_t count = j["parameter_count"].get<int64_t>();
  if (padded > 0)
    std::printf("parameters %zu tensors, %lld values (%lld without the %lld padding rows of wte)\n",
                j["parameters"].size(), (long long)count, (long long)(count - padded),
                (long long)(padded / m["n_embd"].get<int64_t>()));
  else
    std::printf("parameters %zu tensors, %lld values\n", j["parameters"].size(), (long long)count);
  const auto& a = j["accounting"];
  std::printf("memory     %s in one arena: state %s + activations %s (planned: %.2fx the %s they take without reuse)\n",
              human_bytes(j["total_arena_bytes"].get<double>()).c_str(), human_bytes(j["state_bytes"].get<double>()).c_str(),
              human_bytes(j["activation_bytes"].get<double>()).c_str(),
              j["activation_bytes"].get<double>() / std::max(1.0, j["naive_bytes"].get<double>()),
              human_bytes(j["naive_bytes"].get<double>()).c_str());
  std::string dtypes;
  for (const auto& [d, b] : j["buffers"]["bytes_by_dtype"].items()) dtypes += " " + d + " " + human_bytes(b.get<double>());
  std::printf("  by dtype, the state and %s's activations before reuse:%s\n",
              j["buffers"]["activations_of"].get<std::string>().c_str(), dtypes.c_str());
  const double copies = a["compute_copies"].get<double>();
  // (the rest of the arena: alignment of each buffer to 256 bytes)
  std::printf("  parameters %s, gradients %s, AdamW state %s%s%s, inputs and hyperparameters %s, activations %s\n",
              human_bytes(a["parameters"].get<double>()).c_str(), human_bytes(a["gradients"].get<double>()).c_str(),
              human_bytes(a["optimizer_state"].get<double>()).c_str(), copies > 0 ? ", bf16 compute copies " : "",
              copies > 0 ? human_bytes(copies).c_str() : "",
              human_bytes(a["inputs"].get<double>() + a["hyperparameters"].get<double>()).c_str(),
              human_bytes(a["activations"].get<double>()).c_str());
  const auto& peak = j["peak"];
  std::printf("  peak %s live in %s at instr %lld; largest buffers then:\n",
              human_bytes(peak["live_bytes"].get<double>()).c_str(), peak["program"].get<std::string>().c_str(),
              (long long)peak["instr"].get<int64_t>());
  for (const auto& b : peak["largest"])
    std::printf("    %10s  %-36s from %s\n", human_bytes(b["bytes"].get<double>()).c_str(),
                b["buffer"].get<std::string>().c_str(), b["produced_by"].get<std::string>().c_str());
  const auto& fl = j["flops"];
  std::printf("flops      per micro-step (%lld tokens): forward %.3g, backward %.3g, recompute %.3g\n",
              (long long)fl["tokens"].get<int64_t>(), fl["forward"].get<double>(), fl["backward"].get<double>(),
              fl["recompute"].get<double>());
  // The rule counts wpe, as llm.c does, though no product multiplies it: where it is a large part
  // of the parameters (a long context in a small model) the ratio is far below 1, and says why.
  int64_t wpe = 0;
  for (const auto& p : j["parameters"])
    if (p["name"] == "wpe.weight") {
      wpe = 1;
      for (const auto& d : p["shape"]) wpe *= d.get<int64_t>();
    }
  const double rule = fl["rule_6nd_plus_attention"].get<double>(), wpe_part = 6.0 * double(wpe) * fl["tokens"].get<double>();
  std::printf("  6*params*tokens + 12*L*C*T*tokens = %.3g; counted/rule = %.3f", rule, fl["counted_over_rule"].get<double>());
  if (wpe_part > 0.01 * rule)
    std::printf(" (params counts wpe's %lld parameters, which no product multiplies: without them counted/rule = %.3f)", (long long)wpe,
                fl["counted_over_rule"].get<double>() * rule / (rule - wpe_part));
  std::printf("\n");
  const auto& c = j["communication"];
  if (!c["buckets"].empty()) {
    std::printf("ranks      %zu gradient bucket%s, %s averaged per step; %s of it starts while backward work remains\n",
                c["buckets"].size(), c["buckets"].size() == 1 ? "" : "s", human_bytes(c["gradient_bytes_per_step"].get<double>()).c_str(),
                human_bytes(c["bytes_started_during_backward"].get<double>()).c_str());
  }
  if (j.contains("data_parallel")) {
    const auto& d = j["data_parallel"];
    double most = 0;
    for (const auto& b : d["arena_bytes_per_rank"]) most = std::max(most, b.get<double>());
    std::printf("%s%d rank%s%s: an arena of %s per rank (the largest; rank 0's %s), %s in one process\n",
                c["buckets"].empty() ? "ranks      " : "  ", d["ranks"].get<int>(), d["ranks"].get<int>() == 1 ? "" : "s",
                d["zero"].get<int>() ? " with --zero 1" : "", human_bytes(most).c_str(),
                human_bytes(d["arena_bytes_per_rank"][0].get<double>()).c_str(),
                human_bytes(d["arena_bytes_one_process"].get<double>()).c_str());
  }
  std::printf("recompute  %s: %d kernels, %.3g extra FLOPs\n", j["recompute"]["mode"].get<std::string>().c_str(),
              j["recompute"]["kernels"].get<int>(), j["recompute"]["flops"].get<double>());
  std::printf("\n%-16s %8s  ops\n", "program", "instrs");
  for (const auto& p : j["programs"]) {
    std::string ops;
    for (const auto& [op, n] : p["ops"].items()) ops += op + " x" + std::to_string(n.get<int>()) + ", ";
    if (!ops.empty()) ops.resize(ops.size() - 2);
    std::printf("%-16s %8d  %s\n", p["name"].get<std::string>().c_str(), p["instrs"].get<int>(), ops.c_str());
  }
  print_fusion_report(j);
  print_cuda_summary(j);
  print_roofline_summary(j);
}

}  // namespace

// kiln-inspect plot LOG.jsonl... -o loss.svg
int plot_main(int argc, char** argv) {
  CLI::App app{"kiln-inspect plot: draw the loss curves of training logs (JSONL) as SVG", "kiln-inspect plot"};
  std::vector<std::string> logs;
  std::string out;
  // (each is opened, and a missing one named, by loss_plot_svg)
  app.add_option("logs", logs, "JSONL logs written by train --log")->required()->check(kiln::cli::non_empty());
  app.add_option("-o,--output", out, "SVG file to write (-: stdout)")->required()->check(kiln::cli::non_empty());
  if (const int rc = kiln::cli::parse(app, argc, argv); rc >= 0) return rc;
  try {
    if (out != "-") {
      for (const std::string& log : logs) refuse_overwriting("-o", out, {{"a log it reads", log}});
      check_output_file("-o", out);  // before the logs are read
      check_replaceable("-o", out, Writes::Svg);
    }
    std::string svg = loss_plot_svg(logs);
    if (out == "-") {  // as --svg - and --dot -
      std::fwrite(svg.data(), 1, svg.size(), stdout);
      flush_stdout();
      return 0;
    }
    write_file_atomic(out, {{svg.data(), svg.size()}});
    std::fprintf(stderr, "wrote %s\n", out.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
}

int main(int argc, char** argv) {
  kiln::start_process();  // Ctrl-C or a full disk while writing leaves no temporary
  if (argc > 1 && std::string(argv[1]) == "plot") return plot_main(argc - 1, argv + 1);
  // A misspelt "plot" would be taken for the module's name, and the rest for surplus words.
  if (std::error_code ec; argc > 1 && argv[1][0] != '-' && !std::filesystem::exists(argv[1], ec) &&
                          kiln::cli::edit_distance(argv[1], "plot") <= 2) {
    std::fprintf(stderr, "error: %s: no such module or executable; did you mean the subcommand plot? (see kiln-inspect "
                 "--help)\n", kiln::one_line(argv[1]).c_str());
    return 2;
  }
  CLI::App app{"kiln-inspect: report on a Kiln module or training executable\n"
               "(kiln-inspect plot LOG.jsonl -o loss.svg draws loss curves)"};
  app.formatter(std::make_shared<UsageWithPlot>());
  app.set_version_flag("--version", kiln::version_text("kiln-inspect"));
  std::string path, svg, source, dot, program, dot_state = "all";
  int ranks = 1, zero = 0;
  double bucket_mb = 25;  // train's default
  bool json = false, verify = false, buffers = false, cuda_resources = false, roofline = false;
  RooflineRates rates;
  // Rates from a phone's to far past any GPU's: a denormal one would make every time infinite.
  const CLI::Validator tflops = kiln::cli::finite_in(1e-6, 1e7), gbs = kiln::cli::finite_in(1e-3, 1e9);
  app.add_option("module", path, "module (.kiln) or executable written by kilnc")->required();
  app.add_flag("--json", json, "print the report as one JSON object");
  app.add_flag("--buffers", buffers, "list every buffer: kind, dtype, offset, bytes, shape, and the instrs of each program where it is live");
  app.add_flag("--cuda-resources", cuda_resources,
               "cuda modules: every generated function's registers, shared memory and spills as ptxas reported "
               "them, and the blocks per SM they allow");
  app.add_flag("--roofline", roofline,
               "cuda modules: the least time each kernel can take at the rates below (matrix products, other "
               "arithmetic, memory; the slowest of the three) and the highest MFU that allows");
  app.add_option("--peak-tflops", rates.tensor_tflops, "--roofline: matrix-product rate, TFLOP/s")
      ->capture_default_str()->check(tflops);
  app.add_option("--vector-tflops", rates.vector_tflops, "--roofline: rate of other arithmetic, TFLOP/s")
      ->capture_default_str()->check(tflops);
  app.add_option("--bandwidth-gbs", rates.bandwidth_gbs, "--roofline: memory bandwidth, GB/s")
      ->capture_default_str()->check(gbs);
  CLI::Option* ranks_opt =
      app.add_option("--ranks", ranks, "also report the training arena of each of this many data-parallel ranks")
          ->check(kiln::cli::whole(1, 1 << 16));
  app.add_option("--zero", zero, "--ranks: as train --zero (1: each rank keeps its slices of the AdamW moments)")
      ->check(kiln::cli::whole(0, 1))->needs(ranks_opt);
  app.add_option("--bucket-mb", bucket_mb, "--ranks: as train --bucket-mb (for a module without compiled buckets)")
      ->capture_default_str()->check(kiln::cli::positive_finite_float())->needs(ranks_opt);
  app.add_flag("--verify-plan", verify, "check the memory plan (no two live buffers overlap) and say so");
  app.add_option("--svg", svg, "draw the memory timeline of the largest program into this SVG file (- for stdout)");
  CLI::Option* dot_opt = app.add_option("--dot", dot,
                 "write one program as a Graphviz graph to this file (- for stdout): its instructions in order "
                 "(each kernel with the ops it fuses, each built-in op), grouped by phase, and the buffers between "
                 "them; dot -Tsvg F.dot -o F.svg draws it")
      ->type_name("FILE");
  app.add_option("--program", program, "--dot, --svg: the program to draw (default: --dot micro_step, --svg the one of the most activations)");
  app.add_option("--dot-state", dot_state,
                 "--dot: all (also every parameter, compute copy, gradient and moment an instruction uses) or "
                 "inputs (token ids, hyperparameters and key/value caches only)")
      ->capture_default_str()->check(CLI::IsMember({"all", "inputs"}))->needs(dot_opt);
  app.add_option("--kernel-source", source,
                 "write the generated kernels' source the module carries (C++, or the CUDA C++ its cubins were "
                 "compiled from) to this file; - for stdout")
      ->type_name("FILE");
  // One report at a time: a second would be dropped without a word. (--json holds what the text
  // views show, so it goes with them: --roofline --json gives the roofline at --peak-tflops.)
  const char* modes[] = {"--dot", "--svg", "--kernel-source", "--verify-plan", "--json", "--buffers", "--cuda-resources",
                         "--roofline"};
  auto view = [](const std::string& o) { return o == "--buffers" || o == "--cuda-resources" || o == "--roofline"; };
  for (const char* a : modes)
    for (const char* b : modes)
      if (std::string(a) < std::string(b) && !(std::string(a) == "--json" && view(b)) && !(std::string(b) == "--json" && view(a)))
        app.get_option(a)->excludes(app.get_option(b));
  for (const char* out : {"--dot", "--svg", "--kernel-source"}) app.get_option(out)->check(kiln::cli::non_empty());
  for (const char* other : {"--dot", "--svg", "--kernel-source", "--buffers", "--verify-plan", "--cuda-resources",
                            "--roofline"})
    ranks_opt->excludes(app.get_option(other));
  if (const int rc = kiln::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (app.count("--program") && dot.empty() && svg.empty()) {  // (CLI11's needs() takes one option)
    std::fprintf(stderr, "error: --program requires --dot or --svg (see kiln-inspect --help)\n");
    return 2;
  }
  std::string given;
  for (const char* flag : {"--peak-tflops", "--vector-tflops", "--bandwidth-gbs"})
    if (app.count(flag)) given += std::string(given.empty() ? "" : ", ") + flag;
  // The rates are the roofline's (which --json carries too): without it they would change nothing.
  if (!given.empty() && !roofline && !json) {
    std::fprintf(stderr, "error: %s: the roofline's rates: give --roofline (or --json) with them\n", given.c_str());
    return 2;
  }
  if (given.size() == std::string("--peak-tflops, --vector-tflops, --bandwidth-gbs").size()) rates.source = "as given";
  else if (!given.empty()) rates.source = given + " as given, the rest " + rates.source;
  try {
    for (const auto& [flag, out] : {std::pair{"--dot", dot}, {"--svg", svg}, {"--kernel-source", source}})
      if (!out.empty() && out != "-") {
        refuse_overwriting(flag, out, {{"the module it reads", path}});
        check_output_file(flag, out);  // said before the module is read
        check_replaceable(flag, out, std::string(flag) == "--dot"   ? Writes::DotGraph
                                     : std::string(flag) == "--svg" ? Writes::Svg
                                                                    : Writes::KernelSource);
      }
    // Loading verifies the module and its memory plan. A training log given instead is named.
    Module m = [&] {
      try {
        return Module::load(path);
      } catch (const Error&) {
        // A module starts with its root offset or an ELF header, never with '{'.
        // (read_head reads regular files only: reopening a pipe would wait for a writer)
        if (read_head(path, 1) == "{")
          throw Error(path + ": is a JSON log (kiln-inspect plot " + path + " -o loss.svg draws it), not a Kiln module");
        throw;
      }
    }();
    if (verify) {
      std::printf("plan verified: %s, %u buffers, no two live buffers overlap\n", path.c_str(),
                  m.fb().buffers()->size());
      flush_stdout();
      return 0;
    }
    // A file output ("-": stdout), and what was written on stderr.
    auto emit = [](const std::string& out, std::string_view text, const std::string& what) {
      if (out == "-") {
        std::fwrite(text.data(), 1, text.size(), stdout);
        return;
      }
      write_file_atomic(out, {{text.data(), text.size()}});
      std::fprintf(stderr, "wrote %s%s\n", out.c_str(), what.c_str());
    };
    if (!dot.empty()) {
      if (program.empty()) program = "micro_step";
      emit(dot, program_dot(m, program, dot_state == "all" ? GraphState::All : GraphState::Inputs),
           " (program " + program + ")");
    } else if (!svg.empty()) {
      emit(svg, memory_timeline_svg(m, program), program.empty() ? "" : " (program " + program + ")");
    } else if (!source.empty()) {
      const auto* text = m.fb().kernel_source();
      if (!text || text->size() == 0)
        throw Error(path + ": the module carries no generated kernels (compiled with --no-fusion?)");
      emit(source, text->string_view(), " (" + std::to_string(text->size()) + " bytes)");
      // The source's language, where the name says another (editors and compilers go by it).
      const fb::Model* model = m.fb().model();
      const bool cuda = model && model->target() && model->target()->str() == "cuda";
      const std::string ext = std::filesystem::path(source).extension().string();
      if (cuda ? (ext == ".cpp" || ext == ".cc" || ext == ".cxx") : ext == ".cu")
        std::fprintf(stderr, "note: %s: the kernels are %s (kilnc --dump-kernels names them %s)\n", source.c_str(),
                     cuda ? "CUDA C++" : "C++ for the CPU", cuda ? "kernels.cu" : "kernels.cpp");
    } else {
      ordered_json j = report(m, rates);
      if (app.count("--ranks")) j["data_parallel"] = data_parallel_report(m, ranks, zero, bucket_mb);
      // --json with a view: refused where the view would be (a cpu module has no GPU report),
      // not answered with a report that lacks what was asked for.
      if (json && roofline) check_roofline_view(j);
      if (json && cuda_resources) check_cuda_resources_view(j);
      // Names from the module (a spec path, a buffer name) need not be UTF-8: shown as U+FFFD.
      if (json) std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      else if (buffers) print_buffers(j);
      else if (cuda_resources) print_cuda_resources(j);
      else if (roofline) print_roofline(j);
      else print_text(j);
    }
    flush_stdout();  // a report cut short must not pass for a whole one
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
}
