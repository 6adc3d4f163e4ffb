// JSON headers (safetensors, checkpoints) read strictly.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace kiln {

// The JSON text [first, last) as a value whose objects name each key once: JSON lets a key repeat
// and keeps its last value, so a tensor or field named twice would be lost silently. Errors are
// one line, after `where`: "WHERE: JSON parse error: ...", "WHERE: 'KEY' appears twice".
nlohmann::ordered_json parse_json_unique_keys(const char* first, const char* last, const std::string& where);

}  // namespace kiln
