// cli::whole, the check every whole-number option of Kiln's tools goes through: its messages, its
// bounds as the option's type has them (int64_t unless named: an unsigned seed takes 2^64 - 1),
// and the text it leaves for CLI11 to read.
#include "runtime/cli_parse.h"

#include <gtest/gtest.h>

namespace {

// "" when `text` passes (and what it became), else the message.
std::pair<std::string, std::string> check(const CLI::Validator& v, std::string text) {
  std::string message = v(text);
  return {message, message.empty() ? text : ""};
}

TEST(CliWhole, SignedBoundsAndTheirMessages) {
  const CLI::Validator steps = kiln::cli::whole(1);
  EXPECT_EQ(check(steps, "12"), std::make_pair(std::string(), std::string("12")));
  EXPECT_EQ(check(steps, "+12"), std::make_pair(std::string(), std::string("12")));
  EXPECT_EQ(check(steps, "0").first, "Value 0 is too small (a whole number >= 1)");
  EXPECT_EQ(check(steps, "012").first, "Value 012 is not a whole number >= 1 (no leading zeros)");
  EXPECT_EQ(check(steps, "0x10").first, "Value 0x10 is not a whole number >= 1");
  EXPECT_EQ(check(steps, "1.0").first, "Value 1.0 is not a whole number >= 1");
  EXPECT_EQ(check(steps, "").first, "Value  is not a whole number >= 1");
  EXPECT_EQ(check(steps, "9223372036854775807").second, "9223372036854775807");
  EXPECT_EQ(check(steps, "9223372036854775808").first,
            "Value 9223372036854775808 is too large (a whole number at most 9223372036854775807)");
  EXPECT_EQ(check(steps, "99999999999999999999").first,
            "Value 99999999999999999999 is too large (a whole number at most 9223372036854775807)");
  EXPECT_EQ(check(steps, "-99999999999999999999").first, "Value -99999999999999999999 is too small (a whole number >= 1)");
  // Small literal bounds still check an int64_t: 2^31 is past the range, not past an int.
  const CLI::Validator zero = kiln::cli::whole(0, 1);
  EXPECT_EQ(check(zero, "2147483648").first, "Value 2147483648 is too large (a whole number in [0, 1])");
  EXPECT_EQ(check(zero, "-1").first, "Value -1 is too small (a whole number in [0, 1])");
  EXPECT_EQ(check(zero, "-0").second, "0");
  EXPECT_EQ(zero.get_description(), "[0, 1]");
  const CLI::Validator any = kiln::cli::whole(INT64_MIN);
  EXPECT_EQ(check(any, "-9223372036854775808").second, "-9223372036854775808");
  EXPECT_EQ(check(any, "-9223372036854775809").first,
            "Value -9223372036854775809 is too small (a whole number >= -9223372036854775808)");
}

TEST(CliWhole, AnUnsignedSeedTakesEverySixtyFourBitValue) {
  const CLI::Validator seed = kiln::cli::whole<uint64_t>(0);
  EXPECT_EQ(check(seed, "18446744073709551615").second, "18446744073709551615");
  EXPECT_EQ(check(seed, "+7").second, "7");
  EXPECT_EQ(check(seed, "-0").second, "0");
  EXPECT_EQ(check(seed, "18446744073709551616").first,
            "Value 18446744073709551616 is too large (a whole number at most 18446744073709551615)");
  EXPECT_EQ(check(seed, "-1").first, "Value -1 is too small (a whole number >= 0)");
  EXPECT_EQ(check(seed, "010").first, "Value 010 is not a whole number >= 0 (no leading zeros)");
  EXPECT_EQ(check(seed, "+").first, "Value + is not a whole number >= 0");
  EXPECT_EQ(seed.get_description(), "");
}

}  // namespace
