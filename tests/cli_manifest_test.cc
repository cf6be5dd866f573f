// What is ferry's own in the CLI's JSON, now that Boost.JSON parses and escapes: the layout
// pretty_json writes, and the manifest reader's validation, error messages and exact 64-bit
// round trip.
#include <gtest/gtest.h>

#include <unistd.h>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "cli/manifest.h"
#include "cli/pretty_json.h"

namespace ferry::cli {
namespace {

// A file in the temporary directory, removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& text = "") {
    char name[] = "/tmp/ferry_manifest_test_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = name;
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_error(const std::string& text) {
  TempFile file(text);
  Manifest manifest;
  std::string error;
  EXPECT_FALSE(read_manifest(file.path(), manifest, error)) << text;
  return error;
}

// A valid manifest whose one object has `bytes` written as given.
std::string manifest_with_bytes(const std::string& bytes) {
  return R"({"server": "127.0.0.1:1", "checksum_algorithm": "xxh3-64", "objects": [)"
         R"({"ref": "ferry1:x", "bytes": )" +
         bytes + R"(, "tensors": []}]})";
}

TEST(PrettyJson, TwoSpacesPerLevelKeysInInsertionOrder) {
  boost::json::object doc{{"name", "x"},
                          {"count", uint64_t{3}},
                          {"nested", {{"flag", true}, {"none", nullptr}}},
                          {"items", boost::json::array{1, "two"}},
                          {"empty_object", boost::json::object{}},
                          {"empty_array", boost::json::array{}}};
  EXPECT_EQ(pretty_json(doc),
            "{\n"
            "  \"name\": \"x\",\n"
            "  \"count\": 3,\n"
            "  \"nested\": {\n"
            "    \"flag\": true,\n"
            "    \"none\": null\n"
            "  },\n"
            "  \"items\": [\n"
            "    1,\n"
            "    \"two\"\n"
            "  ],\n"
            "  \"empty_object\": {},\n"
            "  \"empty_array\": []\n"
            "}\n");
}

TEST(PrettyJson, DoublesHaveSixDigitsAndNonFiniteOnesAreNull) {
  const boost::json::array numbers{0.1234567, 2.0, 1e-7, std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN()};
  EXPECT_EQ(pretty_json(numbers), "[\n  0.123457,\n  2,\n  1e-07,\n  null,\n  null\n]\n");
}

TEST(PrettyJson, EscapesStringsAndKeys) {
  boost::json::object doc{{"a\"b", "line\nbreak\ttab\\ \x01"}};
  EXPECT_EQ(pretty_json(doc), "{\n  \"a\\\"b\": \"line\\nbreak\\ttab\\\\ \\u0001\"\n}\n");
}

TEST(Manifest, RoundTripsEvery64BitValueAndAnyName) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  Manifest written;
  written.server = "10.0.0.1:7000";
  written.objects.push_back(
      {"ferry1:a", "we\"ights\n\xff.bin", max, {{max, max}, {uint64_t{1} << 63, 0}}});
  written.objects.push_back({"ferry1:b", "", 0, {}});
  TempFile file;
  std::string error;
  ASSERT_TRUE(write_manifest(file.path(), written, error)) << error;
  Manifest read;
  ASSERT_TRUE(read_manifest(file.path(), read, error)) << error;
  EXPECT_EQ(read.server, written.server);
  ASSERT_EQ(read.objects.size(), 2u);
  EXPECT_EQ(read.objects[0].ref, "ferry1:a");
  EXPECT_EQ(read.objects[0].name, written.objects[0].name);
  EXPECT_EQ(read.objects[0].bytes, max);
  ASSERT_EQ(read.objects[0].tensors.size(), 2u);
  EXPECT_EQ(read.objects[0].tensors[0].bytes, max);
  EXPECT_EQ(read.objects[0].tensors[0].checksum, max);
  EXPECT_EQ(read.objects[0].tensors[1].bytes, uint64_t{1} << 63);
  EXPECT_EQ(read.objects[1].name, "");
  EXPECT_TRUE(read.objects[1].tensors.empty());
}

TEST(Manifest, WritesTheLayoutPeopleAndScriptsRead) {
  Manifest m;
  m.server = "h:1";
  m.objects.push_back({"ferry1:a", "", 5, {{5, 0xabc}}});
  EXPECT_EQ(manifest_to_json(m),
            "{\n"
            "  \"server\": \"h:1\",\n"
            "  \"checksum_algorithm\": \"xxh3-64\",\n"
            "  \"objects\": [\n"
            "    {\n"
            "      \"ref\": \"ferry1:a\",\n"
            "      \"bytes\": 5,\n"
            "      \"tensors\": [\n"
            "        {\n"
            "          \"bytes\": 5,\n"
            "          \"checksum\": \"0000000000000abc\"\n"
            "        }\n"
            "      ]\n"
            "    }\n"
            "  ]\n"
            "}\n");
}

TEST(Manifest, SyntaxErrorsSayWhatAndWhere) {
  EXPECT_EQ(read_error(R"({"server": 1,})"), "syntax error at offset 13");
  EXPECT_EQ(read_error(R"({"server": )"), "incomplete JSON at offset 11");
  EXPECT_EQ(read_error("{} x"), "extra data at offset 3");
  EXPECT_EQ(read_error(""), "incomplete JSON at offset 0");
  EXPECT_EQ(read_error(std::string(65, '[') + std::string(65, ']')), "too deep at offset 64");
}

TEST(Manifest, NamesTheFieldThatBreaksTheSchema) {
  EXPECT_EQ(read_error("[]"), "missing \"server\" string");
  EXPECT_EQ(read_error(R"({"server": "h:1"})"), "missing \"objects\" array");
  EXPECT_NE(read_error(R"({"server": "h:1", "objects": []})").find("checksums are not xxh3-64"),
            std::string::npos);
  EXPECT_EQ(read_error(R"({"server": "h:1", "checksum_algorithm": "xxh3-64", "objects": [3]})"),
            "object 0: missing \"ref\" string");
  EXPECT_EQ(read_error(R"({"server": "h:1", "checksum_algorithm": "xxh3-64", "objects": [)"
                       R"({"ref": "r", "bytes": 1, "tensors": [{"bytes": 1}]}]})"),
            "object 0: tensor 0: needs \"bytes\" and a hex \"checksum\"");
}

TEST(Manifest, ByteCountsAreNonNegativeIntegersThatFit64Bits) {
  for (const char* bad : {"-1", "1.0", "1e3", "18446744073709551616", "\"5\""}) {
    EXPECT_EQ(read_error(manifest_with_bytes(bad)), "object 0: missing \"bytes\" number") << bad;
  }
  for (const char* good : {"0", "9223372036854775807", "9223372036854775808"}) {
    TempFile file(manifest_with_bytes(good));
    Manifest manifest;
    std::string error;
    ASSERT_TRUE(read_manifest(file.path(), manifest, error)) << good << ": " << error;
    EXPECT_EQ(std::to_string(manifest.objects.at(0).bytes), good);
  }
}

}  // namespace
}  // namespace ferry::cli
