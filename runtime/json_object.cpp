#include "runtime/json_object.h"

#include <algorithm>
#include <set>
#include <vector>

#include "runtime/error.h"

namespace kiln {

nlohmann::ordered_json parse_json_unique_keys(const char* first, const char* last, const std::string& where) {
  using Json = nlohmann::ordered_json;
  std::vector<std::set<std::string>> keys;  // of each object being parsed, innermost last
  std::string repeated;
  auto note_keys = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    else if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    else if (event == Json::parse_event_t::key && !keys.empty() && repeated.empty() &&
             !keys.back().insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  Json json;
  try {
    json = Json::parse(first, last, note_keys);
  } catch (const Json::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');  // errors are one line
    if (msg.rfind("[json.exception.", 0) == 0 && msg.find("] ") != std::string::npos)
      msg = msg.substr(msg.find("] ") + 2);  // (the library's error id says nothing to a user)
    throw Error(where + ": JSON parse error: " + msg);
  }
  if (!repeated.empty()) throw Error(where + ": '" + repeated + "' appears twice");
  return json;
}

}  // namespace kiln
