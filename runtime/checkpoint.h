// Training checkpoints: everything needed to resume a run bit for bit (parameter values, both
// AdamW moments, the step, the data position and the RNG), in one self-checking file.
//
// File layout (little-endian), version 1:
//   0   "KILNCKPT"                magic
//   8   u32 version               1
//   12  u32 reserved              0
//   16  u64 header_len            bytes of JSON, space-padded so the data starts at a multiple of 64
//   24  u64 file_size             the whole file, trailer included (names truncation in messages)
//   32  JSON header               {"format": "kiln-checkpoint", "step": .., "fingerprint": ..,
//                                  "model": {..}, "parameters": [{"name", "shape", "decay",
//                                  "value": [offset, bytes], "adam_m": [..], "adam_v": [..]}], ..}
//   32 + header_len               data: fp32 tensors; offsets above are relative to here
//   file_size - 4  u32 CRC-32     (IEEE, as zlib) of every byte after the magic, trailer excluded
// Every version keeps the magic, the version field and the CRC trailer, so a reader can always
// tell "not a checkpoint", "corrupt" and "newer than this build" apart.
//
// Gradients are not saved: the trainer zeroes them at the start of every optimizer step. Nor are
// bf16 compute copies: load_checkpoint rounds them afresh from the loaded fp32 values.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "runtime/module.h"

namespace kiln {

struct TrainingState {
  int64_t step = 0;             // the next step to run
  uint64_t data_shard = 0;      // the data loader's position: shard index...
  int64_t data_position = 0;    // ...and token offset within it
  uint64_t rng_state = 0;
  // save: ignored (the file records module_fingerprint of the executor's module);
  // load: the fingerprint the file was saved with (already checked against the module).
  std::string spec_fingerprint;
  int world_size = 1;           // saved and returned; the caller decides what a change means
  int zero_stage = 0;
  std::string extra_json = "{}";  // a JSON object for future fields; round-trips as-is
};

// A ZeRO-1 rank keeps only its slice of each AdamW moment (Executor::held): before a checkpoint
// the ranks gather the whole of them (DataParallel::gather_optimizer_state) for rank 0 to save.
struct WholeMoments {
  std::vector<const float*> adam_m, adam_v;  // by parameter: all its elements
  std::vector<float> storage;                // what they point into where it is no executor memory
  bool empty() const { return adam_m.empty(); }
  // Moved, never copied: a copy's pointers would point into the original's storage.
  WholeMoments() = default;
  WholeMoments(WholeMoments&&) = default;
  WholeMoments& operator=(WholeMoments&&) = default;
  WholeMoments(const WholeMoments&) = delete;
  WholeMoments& operator=(const WholeMoments&) = delete;
};

// A stable 16-hex-digit hash (FNV-1a 64) of what makes a checkpoint fit a module: the model's
// sizes (n_layer, n_head, n_embd, vocab_size, block_size), its precision, and every parameter's
// name, shape and weight-decay flag (sorted by name). Not the batch size, sequence length,
// target, buffer plan or kernels: a run may resume with a recompiled or re-planned module.
std::string module_fingerprint(const Module& module);

// Writes DIR/ckpt_<step, 8 digits>.kiln-ckpt atomically (creating DIR if needed), then points
// DIR/latest at it atomically, then deletes old checkpoints so `keep` remain: the one just written
// and the keep - 1 highest-numbered others (keep <= 0 keeps all). kiln::Error on failure; a
// failed write leaves no temporary file and the previous checkpoints untouched. The moments come
// from `moments` when it is not empty (ZeRO-1), else from the executor, which must hold them whole.
// Returns the checkpoint's path.
std::string save_checkpoint(const std::string& dir, Executor& ex, const TrainingState& state, int keep,
                     const WholeMoments& moments = {});

// Deletes checkpoints in DIR so that `keep` remain: `newest` (a name in DIR) and the keep - 1
// highest-numbered others (keep <= 0 deletes none). Returns how many it deleted; kiln::Error
// naming the file (and `newest` + `why`) when one cannot be deleted.
int prune_checkpoints(const std::string& dir, const std::string& newest, int keep, const std::string& why);

// The tensor bytes one checkpoint of the module holds: each parameter's value and AdamW moments
// (the file is a header and a checksum longer).
uint64_t checkpoint_data_bytes(const Module& m);

// The bytes that temporaries in DIR left by writers killed on this machine hold (the next save
// removes them first): space a run there can count as free.
uint64_t stale_temporary_bytes(const std::string& dir);

// Whether a file name in a checkpoint folder is one the checkpoints use: "latest", or
// ckpt_<digits>.kiln-ckpt (which a later save may replace or prune).
bool is_checkpoint_file_name(const std::string& name);

// The checkpoints in DIR (regular files named ckpt_<step>.kiln-ckpt): (step, name), highest step
// first. kiln::Error when DIR cannot be listed.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// The path (DIR/<name>) of the checkpoint DIR/latest names, or, if there is no `latest`, of the
// highest-numbered ckpt_*.kiln-ckpt; nullopt when DIR does not exist or holds none. kiln::Error
// when `latest` exists but is unreadable or names a missing file.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Whether the file is a checkpoint whose frame, checksum and header are whole (it reads it all);
// not whether it fits a module.
bool is_whole_checkpoint(const std::string& path);

// The newest whole checkpoint in DIR other than `except` (a path as latest_checkpoint gives it):
// where a resume can go on when the latest is damaged. nullopt when there is none, or DIR cannot
// be listed.
std::optional<std::string> newest_whole_checkpoint(const std::string& dir, const std::string& except);

// Reads and validates the whole file (magic, checksum, version, length, header, fingerprint
// against ex's module, every parameter present with its shape) before copying anything, so on
// any kiln::Error the executor is untouched. Then refreshes the bf16 compute copies and returns
// the saved state; world_size and zero_stage are for the caller to check. An executor that keeps
// slices of the moments (ZeRO-1) takes those elements of them. `weights_only` (--init from a
// checkpoint: evaluation, sampling, a fresh run) copies the values alone, after the same checks.
TrainingState load_checkpoint(const std::string& path, Executor& ex, bool weights_only = false);

}  // namespace kiln
