#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/linear_regex.h"

using namespace ckpt;

namespace {

bool searches(const std::string& pattern, const std::string& subject, unsigned flags = 0) {
  return LinearRegex::compile(pattern, flags).search(subject);
}
bool matches(const std::string& pattern, const std::string& subject, unsigned flags = 0) {
  return LinearRegex::compile(pattern, flags).match(subject);
}

// The groups of the whole match of pattern against subject; "<unset>" for a
// group that did not take part, {} when there is no match.
std::vector<std::string> groups_of(const std::string& pattern, const std::string& subject, bool whole = true,
                                   unsigned flags = 0) {
  LinearRegex re = LinearRegex::compile(pattern, flags);
  RegexMatch m;
  if (!(whole ? re.match(subject, m) : re.search(subject, m))) return {};
  std::vector<std::string> out;
  for (std::size_t i = 0; i < m.size(); ++i) out.push_back(m.matched(i) ? m.str(i) : "<unset>");
  return out;
}

std::string error_of(const std::string& pattern) {
  try {
    LinearRegex::compile(pattern);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.message();
  }
  return "";
}

using Groups = std::vector<std::string>;

}  // namespace

TEST_CASE("linear regex: literals, escapes and the dot", "[core][regex]") {
  CHECK(searches("weight", "layers.0.weight"));
  CHECK_FALSE(searches("weights", "layers.0.weight"));
  CHECK(matches(R"(a\.b)", "a.b"));
  CHECK_FALSE(matches(R"(a\.b)", "axb"));
  CHECK(matches("a.b", "axb"));
  CHECK_FALSE(matches("a.b", "a\nb"));  // the dot matches neither \n nor \r
  CHECK_FALSE(matches("a.b", "a\rb"));
  CHECK(matches(R"(\t\n\r\f\v)", "\t\n\r\f\v"));
  CHECK(matches(R"(\x41\u0042\cJ)", "AB\n"));
  CHECK(matches(std::string(R"(a\0b)"), std::string("a\0b", 3)));
  CHECK(matches(R"(\(\)\[\]\{\}\*\+\?\|\^\$\\\/)", R"(()[]{}*+?|^$\/)"));
  CHECK(matches("a]b}", "a]b}"));  // ] and } alone are literals
  CHECK(matches("", ""));
  CHECK(searches("", "anything"));
}

TEST_CASE("linear regex: classes, ranges and class escapes", "[core][regex]") {
  CHECK(matches("[abc]+", "cab"));
  CHECK_FALSE(matches("[abc]+", "cabd"));
  CHECK(matches("[^abc]+", "xyz"));
  CHECK_FALSE(matches("[^abc]", "a"));
  CHECK(matches("[a-z0-9_]+", "layer_12"));
  CHECK_FALSE(matches("[a-z]", "A"));
  CHECK(matches("[-a]+", "-a-"));
  CHECK(matches("[a-]+", "-a-"));
  CHECK(matches(R"([\]\\]+)", R"(]\)"));
  CHECK(matches(R"(\d+)", "0123456789"));
  CHECK_FALSE(matches(R"(\d)", "a"));
  CHECK(matches(R"(\D\W\S)", "a.x"));
  CHECK_FALSE(matches(R"(\S)", " "));
  CHECK(matches(R"(\w+)", "aZ_09"));
  CHECK_FALSE(matches(R"(\w)", "."));
  CHECK(matches(R"(\s+)", " \t\n\v\f\r"));
  CHECK(matches(R"([\d.]+)", "1.5"));
  CHECK(matches(R"([^\d]+)", "ab"));
  CHECK_FALSE(matches(R"([^\d])", "5"));
  CHECK(matches("[[:alpha:]][[:digit:]][[:space:]]", "a1 "));
  CHECK(matches(R"([\b])", "\b"));   // backspace inside a class
  CHECK_FALSE(searches("[]", "a"));  // matches nothing
  CHECK(matches("[^]", "\n"));       // any byte
  CHECK(matches("\\xff", "\xff"));
  CHECK(matches("[\\x80-\\xff]+", "\x80\xc3\xa9"));
  CHECK_FALSE(matches(R"(\w)", "\xc3"));  // bytes above ASCII are not word characters
}

TEST_CASE("linear regex: anchors and word boundaries", "[core][regex]") {
  CHECK(searches("^model\\.", "model.fc.weight"));
  CHECK_FALSE(searches("^model\\.", "optim.model.x"));
  CHECK(searches("weight$", "fc.weight"));
  CHECK_FALSE(searches("weight$", "fc.weight.x"));
  CHECK_FALSE(searches("^b", "a\nb"));  // not multiline: ^ and $ are the subject's ends
  CHECK_FALSE(searches("a$", "a\nb"));
  CHECK(searches("^$", ""));
  CHECK(searches(R"(\bfc\b)", "model.fc.weight"));
  CHECK_FALSE(searches(R"(\bfc\b)", "model.fc1.weight"));
  CHECK(searches(R"(\Bc1)", "model.fc1.weight"));
  CHECK_FALSE(searches(R"(\Bfc)", "model.fc1"));
}

TEST_CASE("linear regex: groups, alternation and quantifiers", "[core][regex]") {
  CHECK(matches("(ab)+", "ababab"));
  CHECK_FALSE(matches("(ab)+", "ababa"));
  CHECK(matches("(?:ab)*c", "c"));
  CHECK(matches("a|bc|d", "bc"));
  CHECK_FALSE(matches("a|bc|d", "b"));
  CHECK(searches("exp_avg(_sq)?$", "optim.state.w.exp_avg_sq"));
  CHECK(searches("exp_avg(_sq)?$", "optim.state.w.exp_avg"));
  CHECK(searches("fc2|emb", "model.emb.weight"));
  CHECK(matches("a?b", "b"));
  CHECK(matches("a{3}", "aaa"));
  CHECK_FALSE(matches("a{3}", "aa"));
  CHECK_FALSE(matches("a{3}", "aaaa"));
  CHECK(matches("a{2,}", "aaaaa"));
  CHECK_FALSE(matches("a{2,}", "a"));
  CHECK(matches("a{2,4}", "aaaa"));
  CHECK_FALSE(matches("a{2,4}", "aaaaa"));
  CHECK(matches("a{0}b", "b"));
  CHECK_FALSE(matches("(a|b){1,3}c", "ababc"));
  CHECK(matches("(a|b){1,3}c", "bac"));
  CHECK(matches("a*?b+?c??", "aab"));
  CHECK(matches("(a*)*b", "aaab"));  // a loop whose body matches empty ends
  CHECK(matches("(a|)+b", "aab"));
  CHECK(matches("x*", ""));
}

TEST_CASE("linear regex: lookahead", "[core][regex]") {
  // tests/test_torchtitan.py keeps every key but one family this way.
  const std::string no_scale = R"(^(?!optimizer\.param_groups\.scale\.))";
  CHECK(searches(no_scale, "optimizer.state.w.exp_avg"));
  CHECK_FALSE(searches(no_scale, "optimizer.param_groups.scale.0"));
  CHECK(searches("^(?=.*weight)(?!.*bias)", "fc.weight"));
  CHECK_FALSE(searches("^(?=.*weight)(?!.*bias)", "fc.weight.bias"));
  CHECK(matches("a(?=b)b", "ab"));
  CHECK_FALSE(matches("a(?=c)b", "ab"));
  CHECK(searches("(?=(?!x)a)a", "xa"));  // nested
  CHECK(matches("(?=.*$).*", "abc"));
}

TEST_CASE("linear regex: icase", "[core][regex]") {
  CHECK(matches("RANK", "rank", LinearRegex::kIcase));
  CHECK(matches("rank", "RaNk", LinearRegex::kIcase));
  CHECK_FALSE(matches("rank", "RaNk"));
  CHECK(matches("[a-c]+", "AbC", LinearRegex::kIcase));
  CHECK(matches("[^a]", "b", LinearRegex::kIcase));
  CHECK_FALSE(matches("[^a]", "A", LinearRegex::kIcase));
  CHECK(matches("[[:lower:]]+", "ABC", LinearRegex::kIcase));
  CHECK(matches("_1", "_1", LinearRegex::kIcase));
}

TEST_CASE("linear regex: captures follow backtracking's order", "[core][regex]") {
  // The file-name patterns the readers use, with what std::regex gave.
  const std::string distcp = R"(__(\d+)_(\d+)\.distcp)";
  CHECK(groups_of(distcp, "__12_0.distcp") == Groups{"__12_0.distcp", "12", "0"});
  CHECK(groups_of(distcp, "__12_0.distcpx").empty());
  const std::string generic = R"(^(.*?rank[_-]?)(\d+)(.*)$)";
  CHECK(groups_of(generic, "model_RANK_3_of_rank4.pt", true, LinearRegex::kIcase) ==
        Groups{"model_RANK_3_of_rank4.pt", "model_RANK_", "3", "_of_rank4.pt"});
  CHECK(groups_of(generic, "rank12.pt", true, LinearRegex::kIcase) == Groups{"rank12.pt", "rank", "12", ".pt"});
  CHECK(groups_of(generic, "rank-007x", true) == Groups{"rank-007x", "rank-", "007", "x"});
  const std::string verl = R"(^(.*)_world_size_(\d+)_rank_(\d+)(\.[A-Za-z]+)$)";
  CHECK(groups_of(verl, "model_world_size_4_rank_2.pt") ==
        Groups{"model_world_size_4_rank_2.pt", "model", "4", "2", ".pt"});
  const std::string shard = R"((.+)/shard_(\d+(?:\.\d+)*)_(\d+(?:\.\d+)*))";
  CHECK(groups_of(shard, "a/shard_x/shard_0.1_2.4") == Groups{"a/shard_x/shard_0.1_2.4", "a/shard_x", "0.1", "2.4"});
  CHECK(groups_of(shard, "a/shard_1_2/shard_3_4") == Groups{"a/shard_1_2/shard_3_4", "a/shard_1_2", "3", "4"});
  const std::string zero = R"(^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$)";
  CHECK(groups_of(zero, "zero_pp_rank_1_mp_rank_00_optim_states.pt") ==
        Groups{"zero_pp_rank_1_mp_rank_00_optim_states.pt", "<unset>", "1", "00"});
  CHECK(groups_of(zero, "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt")[1] == "bf16_");
  const std::string version = R"(^__version__\s*=\s*'([^']+)')";
  CHECK(groups_of(version, "__version__ = '2.5.1+cu124'  # x", false) ==
        Groups{"__version__ = '2.5.1+cu124'", "2.5.1+cu124"});
  // Greedy and lazy choices, the first alternative first, leftmost.
  CHECK(groups_of("(a+)(a*)", "aaa") == Groups{"aaa", "aaa", ""});
  CHECK(groups_of("(a+?)(a*)", "aaa") == Groups{"aaa", "a", "aa"});
  CHECK(groups_of("(a|ab)(c|bcd)", "abcd") == Groups{"abcd", "a", "bcd"});
  CHECK(groups_of("(x)|(y)", "y") == Groups{"y", "<unset>", "y"});
  CHECK(groups_of("b+", "aabbbcbb", false) == Groups{"bbb"});
  CHECK(groups_of("((a)|b)+", "ab") == Groups{"ab", "b", "a"});

  RegexMatch m;
  LinearRegex coord = LinearRegex::compile(R"( at \([0-9, ]*\))");
  REQUIRE(coord.search("DTensor: mesh (2) at (1), placements (Shard(0))", m));
  CHECK(m.position(0) == 17);
  CHECK(m.length(0) == 7);
  CHECK(m.size() == 1);
  CHECK(coord.groups() == 0);
  CHECK_FALSE(m.matched(1));
  CHECK(m.position(1) == std::string_view::npos);
  CHECK(LinearRegex::compile(distcp).groups() == 2);
  CHECK(LinearRegex::compile(distcp).pattern() == distcp);
}

TEST_CASE("linear regex: bad patterns are refused with their reason", "[core][regex]") {
  CHECK(error_of("(") == "unmatched '(' at offset 0");
  CHECK(error_of("a(b") == "unmatched '(' at offset 1");
  CHECK(error_of("a)") == "unmatched ')' at offset 1");
  CHECK(error_of("[a") == "unterminated character class '[' at offset 0");
  CHECK(error_of("*a") == "nothing to repeat at offset 0");
  CHECK(error_of("a**") == "nothing to repeat at offset 2");
  CHECK(error_of("a{2}{3}") == "nothing to repeat at offset 4");
  CHECK(error_of("^*") == "nothing to repeat (an assertion cannot be repeated) at offset 1");
  CHECK(error_of("a{") == "invalid repetition braces (expected {m}, {m,} or {m,n}) at offset 1");
  CHECK(error_of("a{x}") == "invalid repetition braces (expected {m}, {m,} or {m,n}) at offset 1");
  CHECK(error_of("a{3,2}") == "repetition {m,n} with n below m at offset 1");
  CHECK(error_of("a{1001}") == "repetition count above 1000 at offset 1");
  CHECK(error_of("[z-a]") == "invalid range in a character class (its end is below its start) at offset 1");
  CHECK(error_of(R"([\d-z])") == "a class escape cannot bound a range in a character class at offset 1");
  CHECK(error_of("[[:nope:]]") == "unknown character class name [:nope:] at offset 1");
  CHECK(error_of("[[.a.]]") ==
        "collating elements and equivalence classes ([. .] [= =]) are not supported at offset 1");
  CHECK(error_of(R"((a)\1)") == "backreferences are not supported at offset 3");
  CHECK(error_of("(?<=a)b") == "lookbehind (?<= (?<! is not supported at offset 0");
  CHECK(error_of("(?<!a)b") == "lookbehind (?<= (?<! is not supported at offset 0");
  CHECK(error_of("(?<n>a)") == "named groups (?<name> are not supported at offset 0");
  CHECK(error_of("(?i)a") == "unsupported group syntax (?i at offset 0");
  CHECK(error_of("a\\") == "trailing backslash at offset 1");
  CHECK(error_of(R"(\x4)") == "\\x needs 2 hexadecimal digits at offset 0");
  CHECK(error_of(R"(\u0100)") == "\\u above \\u00FF (patterns match bytes) at offset 0");
}

TEST_CASE("linear regex: hostile patterns are bounded when compiled", "[core][regex]") {
  // Counted repetitions are expanded, within a bound on the program.
  CHECK(error_of("(a{1000}){1000}") ==
        "the pattern is too large: more than 100000 instructions once its counted repetitions are expanded");
  CHECK(error_of("((((a{1000}){1000}){1000}){1000})") ==
        "the pattern is too large: more than 100000 instructions once its counted repetitions are expanded");
  CHECK(matches("a{1000}", std::string(1000, 'a')));
  // Parentheses nest to a bound, so compiling cannot run out of stack.
  CHECK(matches(std::string(200, '(') + "a" + std::string(200, ')'), "a"));
  CHECK(error_of(std::string(201, '(') + "a" + std::string(201, ')')) ==
        "parentheses nested deeper than 200 at offset 200");
  CHECK(error_of(std::string(100000, '(')) == "parentheses nested deeper than 200 at offset 200");
  // Each lookahead costs a bit per subject byte: their number is bounded.
  std::string looks;
  for (int i = 0; i < 64; ++i) looks += "(?=a)";
  CHECK(matches(looks + "a", "a"));
  CHECK(error_of(looks + "(?!b)a") == "more than 64 lookaheads at offset 320");
  // Reporting groups keeps their positions per live thread: bounded too; the
  // boolean forms still answer.
  std::string groups;
  for (int i = 0; i < 2000; ++i) groups += "(a?)";
  LinearRegex many_groups = LinearRegex::compile(groups);
  CHECK(many_groups.match("aaa"));
  RegexMatch m;
  try {
    many_groups.match("aaa", m);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kResourceExhausted);
    CHECK(e.message().find("2000 groups in a program of") != std::string::npos);
  }
  // A long flat pattern (a list of keys) is no deeper than a short one.
  std::string many;
  for (int i = 0; i < 2000; ++i) {
    if (i) many += '|';
    many += "layers\\.";
    many += std::to_string(i);
    many += "\\.weight";
  }
  CHECK(searches(many, "model.layers.1999.weight"));
  CHECK_FALSE(searches(many, "model.layers.2000.weight"));
}

TEST_CASE("linear regex: a 1,000,000-character subject neither recurses nor backtracks", "[core][regex]") {
  const std::string a(1000000, 'a');
  CHECK_FALSE(searches(".*weight$", a));
  CHECK(searches(".*weight$", a + "weight"));
  CHECK(matches(".*weight", a + "weight"));
  CHECK_FALSE(searches("(a|b)*c", a));
  CHECK(searches("(a|b)*c", a + "c"));
  CHECK_FALSE(searches("(a+)+$", a + "!"));  // exponential for a backtracking matcher
  CHECK(searches("^(?!x).*$", a));
  RegexMatch m;
  const std::string ac = a + "c";
  REQUIRE(LinearRegex::compile("(a|b)*(c)").search(ac, m));
  CHECK(m.length(0) == 1000001);
  CHECK(m.str(2) == "c");
  const std::string item = a + "/shard_1_2";
  REQUIRE(LinearRegex::compile(R"((.+)/shard_(\d+)_(\d+))").match(item, m));
  CHECK(m.length(1) == 1000000);
  CHECK(m.str(3) == "2");
}
