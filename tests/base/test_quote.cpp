// Shell words and CSV fields (base/quote.hpp): every string a field may hold reads back unchanged, with
// fastudy's own reader and with the report's (Python's csv module through analysis/report/readers.py);
// a control character is refused by csv_field and made a blank by the free-text form; a shell word is
// always one line.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/quote.hpp"
#include "fastudy/version.hpp"  // FASTUDY_PYTHON, FASTUDY_SOURCE_DIR

namespace fastudy {
namespace {

// Strings that break a naive CSV writer or reader: separators, quotes, a leading '#' (a provenance
// line to the report's reader), blanks at the ends, Unicode line separators (U+2028, U+0085) that
// Python's str.splitlines splits at, and an empty field.
const std::vector<std::string> kHostile = {
    "plain", "pc,evil", "say \"hi\"", "\"", ",", "#not a comment", " padded ", "", "a;b=c",
    "line\xe2\x80\xa8sep", "nel\xc2\x85x", "caf\xc3\xa9", "=1+2", "back\\slash"};

TEST(CsvField, EveryHostileStringReadsBackUnchanged) {
  std::string text;
  for (const auto& s : kHostile) text += csv_field(s) + "," + csv_field(s + "x") + "\n";
  std::size_t at = 0;
  for (const auto& s : kHostile) {
    const std::vector<std::string> fields = csv_split_record(text, at);
    ASSERT_EQ(fields.size(), 2u) << s;
    EXPECT_EQ(fields[0], s);
    EXPECT_EQ(fields[1], s + "x");
  }
  EXPECT_EQ(at, text.size());
  EXPECT_EQ(csv_field("flash-bf16-s1"), "flash-bf16-s1");  // a plain name is written as it is
  EXPECT_EQ(csv_field("#x"), "\"#x\"");
}

TEST(CsvField, AControlCharacterIsRefusedAndFreeTextBecomesOneLine) {
  for (const std::string& s : {std::string("pn\nevil"), std::string("a\rb"), std::string("nul\0x", 5), std::string("t\tb")}) {
    try {
      csv_field(s);
      ADD_FAILURE() << "accepted a control character";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("control character"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "the message is one line";
    }
  }
  EXPECT_EQ(csv_text_field("failed\nat step 3, badly"), "\"failed at step 3, badly\"");
  EXPECT_EQ(one_line(std::string("a\0b\x1f", 4)), "a b ");
}

TEST(ShellWord, IsOneLineAndPlainWordsStayAsTheyAre) {
  EXPECT_EQ(shell_word("configs/quick.toml"), "configs/quick.toml");
  EXPECT_EQ(shell_word("my grid.toml"), "'my grid.toml'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("a\nid>pwned"), "$'a\\x0aid>pwned'");
  for (const auto& s : kHostile) EXPECT_EQ(shell_word(s + "\n").find('\n'), std::string::npos) << s;
}

// The report reads every CSV with analysis/report/readers.py: what csv_field writes, it reads back.
TEST(CsvField, TheReportsReaderReadsBackWhatIsWritten) {
  const std::string dir = ::testing::TempDir();
  const std::string csv = dir + "/hostile.csv", expected = dir + "/hostile.txt";
  {
    std::ofstream out(csv, std::ios::binary), want(expected, std::ios::binary);
    out << "# fastudy 0.1.0 (git x)\n# grid: " << shell_word("g\nrid.toml") << "\nname,other\n";
    for (const auto& s : kHostile) {
      out << csv_field(s) << "," << csv_field(s + "x") << "\n";
      want << s << "|" << s << "x\n";
    }
  }
  const std::string cmd = std::string(FASTUDY_PYTHON) + " -c \"import sys; sys.path.insert(0, '" FASTUDY_SOURCE_DIR
                          "/analysis'); from report.readers import read_csv_table; t = read_csv_table(sys.argv[1]); "
                          "sys.stdout.buffer.write(''.join(r['name'] + '|' + r['other'] + chr(10) for r in t.rows)"
                          ".encode())\" " + csv;
  if (std::system((std::string(FASTUDY_PYTHON) + " -c 'import numpy' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << FASTUDY_PYTHON << " cannot import numpy, which the report's reader needs";
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string got;
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) got.append(buf.data(), n);
  ASSERT_EQ(::pclose(p), 0) << got;
  std::ifstream in(expected, std::ios::binary);
  const std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, want);
  std::filesystem::remove(csv);
  std::filesystem::remove(expected);
}

}  // namespace
}  // namespace fastudy

namespace fastudy {
namespace {

// Names from other stacks in messages and provenance (escaped, quoted_name): one line, UTF-8, and no
// two names alike.
TEST(Escaped, NamesOfAnyBytesBecomeOneLineOfUtf8) {
  EXPECT_EQ(escaped("a\tb\nc"), "a\\tb\\nc");
  EXPECT_EQ(escaped("a\\tb"), "a\\\\tb");  // not the same text as a tab
  EXPECT_EQ(escaped(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escaped("a\xff" "b"), "a\\xffb");          // no UTF-8 sequence
  EXPECT_EQ(escaped("caf\xc3\xa9 \xe2\x80\xa8"), "caf\xc3\xa9 \xe2\x80\xa8");  // whole sequences kept
  EXPECT_EQ(escaped("\xc3"), "\\xc3");                 // a sequence cut short
  EXPECT_EQ(quoted_name("enc/layer0/w"), "'enc/layer0/w'");
  const std::string longer(300, 'x');
  EXPECT_EQ(quoted_name(longer), "'" + std::string(200, 'x') + "'...");
}

}  // namespace
}  // namespace fastudy
