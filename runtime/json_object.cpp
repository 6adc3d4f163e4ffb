#include "runtime/json_object.h"

#include <algorithm>

#include "runtime/error.h"

namespace kiln {

nlohmann::ordered_json parse_json_unique_keys(const char* first, const char* last, const std::string& where) {
  using Json = nlohmann::ordered_json;
  std::optional<std::string> repeated;
  Json json;
  try {
    json = parse_json_noting_repeated_key<Json>(first, last, repeated);
  } catch (const Json::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');  // errors are one line
    if (msg.rfind("[json.exception.", 0) == 0 && msg.find("] ") != std::string::npos)
      msg = msg.substr(msg.find("] ") + 2);  // (the library's error id says nothing to a user)
    throw Error(where + ": JSON parse error: " + msg);
  }
  if (repeated) throw Error(where + ": '" + *repeated + "' appears twice");
  return json;
}

}  // namespace kiln
