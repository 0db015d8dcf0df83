// Json: round trips, accessors and the errors of the reader.
#include "passes/json.h"

#include <gtest/gtest.h>

#include "ir/error.h"

namespace modelpar::passes {
namespace {

TEST(Json, RoundTripsNestedDocument) {
  Json j = Json::object();
  j.set("name", Json("gpu \"0\"\n"));
  j.set("bytes", Json(int64_t{17179869184}));
  j.set("ratio", Json(0.1));
  Json arr = Json::array();
  arr.push(Json(true));
  arr.push(Json());
  arr.push(Json(-3));
  j.set("list", std::move(arr));
  for (int indent : {-1, 2}) {
    Json back = Json::parse(j.dump(indent));
    EXPECT_EQ(back, j);
  }
  EXPECT_EQ(j.at("bytes").integer(), 17179869184);
  EXPECT_EQ(j.dump(), R"({"bytes":17179869184,"list":[true,null,-3],"name":"gpu \"0\"\n","ratio":0.1})");
}

TEST(Json, ReadsEscapesAndUnicode) {
  Json j = Json::parse(R"(["a\u00e9\ud83d\ude00", "\t\/"])");
  EXPECT_EQ(j.items()[0].string(), "a\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(j.items()[1].string(), "\t/");
}

TEST(Json, RejectsMalformedTextWithPosition) {
  try {
    Json::parse("{\n  \"a\": 1,\n  \"a\": 2}");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("3:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Json::parse("[1, 2"), ConfigError);
  EXPECT_THROW(Json::parse("01x"), ConfigError);
  EXPECT_THROW(Json::parse("{} extra"), ConfigError);
  EXPECT_THROW(Json::parse("\"abc"), ConfigError);
}

TEST(Json, AccessorsNameWhatIsWrong) {
  Json j = Json::parse(R"({"n": 1.5, "s": "x"})");
  try {
    j.at("n").integer("memory_bytes");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("memory_bytes must be an integer"), std::string::npos);
  }
  EXPECT_THROW(j.at("s").number("peak_flops"), ConfigError);
  EXPECT_THROW(j.at("missing"), ConfigError);
  EXPECT_EQ(j.find("missing"), nullptr);
}

}  // namespace
}  // namespace modelpar::passes
