// formats/json_listing.h: the exact text of a listing (one array element per line).
#include "formats/json_listing.h"

#include <gtest/gtest.h>

#include <string>

namespace k3::listing {
namespace {

using ojson = nlohmann::ordered_json;

TEST(JsonListing, OneMemberPerLineAndOneArrayElementPerLineInOrder) {
  ojson doc;
  doc["format"] = "k3-example";
  doc["version"] = 1;
  doc["totals"] = {{"b", 2}, {"a", 1}};
  doc["items"] = ojson::array({ojson{{"name", "x"}, {"shape", {2, 3}}}, ojson{{"name", "y"}}});
  EXPECT_EQ(Dump(doc),
            "{\n"
            " \"format\": \"k3-example\",\n"
            " \"version\": 1,\n"
            " \"totals\": {\"b\":2,\"a\":1},\n"
            " \"items\": [\n"
            "  {\"name\":\"x\",\"shape\":[2,3]},\n"
            "  {\"name\":\"y\"}\n"
            " ]\n"
            "}\n");
  EXPECT_EQ(ojson::parse(Dump(doc)), doc);
}

TEST(JsonListing, EmptyArrayAndEmptyObject) {
  ojson doc;
  doc["items"] = ojson::array();
  EXPECT_EQ(Dump(doc), "{\n \"items\": []\n}\n");
  EXPECT_EQ(Dump(ojson::object()), "{}\n");
}

TEST(JsonListing, StringsAreEscapedByNlohmannAndInvalidUtf8Replaced) {
  ojson doc;
  doc["name"] = std::string("q\"\\\n\xff");
  EXPECT_EQ(Dump(doc), "{\n \"name\": \"q\\\"\\\\\\n\xEF\xBF\xBD\"\n}\n");
}

}  // namespace
}  // namespace k3::listing
