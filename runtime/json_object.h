// JSON headers (safetensors, checkpoints) read strictly.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace kiln {

// The JSON text [first, last) parsed as Json (nlohmann's parse errors thrown as they are), with
// `repeated` set to the first key an object names twice: JSON lets a key repeat and keeps its last
// value. (Json: nlohmann::json where the keys are many, as ordered_json finds each linearly.)
template <class Json>
Json parse_json_noting_repeated_key(const char* first, const char* last, std::optional<std::string>& repeated) {
  std::vector<std::unordered_set<std::string>> keys;  // of each object being parsed, innermost last
  auto note_keys = [&](int /*depth*/, typename Json::parse_event_t event, Json& parsed) {
    using E = typename Json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    else if (event == E::object_end && !keys.empty()) keys.pop_back();
    else if (event == E::key && !keys.empty() && !repeated && !keys.back().insert(parsed.template get<std::string>()).second)
      repeated = parsed.template get<std::string>();
    return true;
  };
  return Json::parse(first, last, note_keys);
}

// The JSON text [first, last) as a value whose objects name each key once: JSON lets a key repeat
// and keeps its last value, so a tensor or field named twice would be lost silently. Errors are
// one line, after `where`: "WHERE: JSON parse error: ...", "WHERE: 'KEY' appears twice".
nlohmann::ordered_json parse_json_unique_keys(const char* first, const char* last, const std::string& where);

}  // namespace kiln
