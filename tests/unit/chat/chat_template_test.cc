// Language features and error handling of the chat-template interpreter.
// Expected strings were checked against Python jinja2 3.1.6 in Hugging
// Face's setup (trim_blocks, lstrip_blocks, loopcontrols).
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "coordinator/chat/chat_template.h"

namespace lazykv {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& context = Json::object()) {
  return ChatTemplate(source).render(context);
}

// The error a template raises, with its code.
std::pair<ErrorCode, std::string> error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {ErrorCode::kInternal, "no error"};
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {{- 'b' -}}\n  c"), "abc");
  EXPECT_EQ(render("a {#- comment -#} b"), "ab");
  // trim_blocks eats the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("x\n  {% if true %}\n  y\n  {% endif %}\nz"), "x\n  y\nz");
  // Not for {{ }}, and not with {%+.
  EXPECT_EQ(render("  {{ 'v' }}\n  {%+ if true %}w{% endif %}"), "  v\n  w");
  // One trailing newline of the template is dropped, as jinja2 does.
  EXPECT_EQ(render("hi\n"), "hi");
  EXPECT_EQ(render("hi\r\nthere"), "hi\nthere");
}

TEST(ChatTemplate, ExpressionsAndLiterals) {
  EXPECT_EQ(render("{{ 'a\\tb\\n\\u00e9\\x41' }}"), "a\tb\n\xC3\xA9" "A");
  EXPECT_EQ(render("{{ \"it's\" ~ 'x' 'y' }}"), "it'sxy");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.0] }}"), "[1, 'a', None, True, 1.0]");
  EXPECT_EQ(render("{{ {'k': [1]} }}"), "{'k': [1]}");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 8 }} {{ 'ab' * 2 }}"), "3 2 3.5 256 abab");
  EXPECT_EQ(render("{{ 1 + 2 * 3 - 4 }}|{{ (1 + 2) * 3 }}|{{ -2 ** 2 }}"), "3|9|4");
  EXPECT_EQ(render("{{ 'yes' if x else 'no' }}{{ 'only' if x }}", {{"x", 0}}), "no");
  EXPECT_EQ(render("{{ 1 < 2 and not 2 > 3 }} {{ 0 or 'b' }} {{ 'a' and '' }}"), "True b ");
  EXPECT_EQ(render("{{ 'b' in 'abc' }}{{ 2 not in [1] }}{{ 'k' in {'k': 1} }}"), "TrueTrueTrue");
  EXPECT_EQ(render("{{ s[1:] }}|{{ s[::-1] }}|{{ s[-1] }}|{{ xs[1:3] }}", {{"s", "abcd"}, {"xs", {1, 2, 3, 4}}}),
            "bcd|dcba|d|[2, 3]");
  EXPECT_EQ(render("{{ x.y }}|{{ x['y'] }}|{{ x.y.z is defined }}", {{"x", {{"y", "v"}}}}), "v|v|False");
  // A filter binds tighter than +: 'a' + (b | trim).
  EXPECT_EQ(render("{{ 'a' + b | trim + 'c' }}", {{"b", "  b  "}}), "abc");
}

TEST(ChatTemplate, UndefinedIsFalsyAndPrintsEmpty) {
  EXPECT_EQ(render("[{{ missing }}][{{ m.content }}][{{ 'set' if m.tool_calls else 'unset' }}]",
                   {{"m", {{"role", "user"}}}}),
            "[][][unset]");
  EXPECT_EQ(render("{% for x in missing %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{{ missing | default('d') }}{{ missing | length }}{{ missing is undefined }}"), "d0True");
}

TEST(ChatTemplate, Loops) {
  Json ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ x }}"
                   "{{ '|' if not loop.last }}{% endfor %}",
                   ctx),
            "103a|212b|321c");
  EXPECT_EQ(render("{% for x in xs if x != 'b' %}{{ x }}{{ loop.length }}{% endfor %}", ctx), "a2c2");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}),
            "z=1;a=2;");
  EXPECT_EQ(render("{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}"
                   "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
  // A set inside a loop does not leak out of it; namespaces carry state across iterations.
  EXPECT_EQ(render("{% set x = 0 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}"
                   "{% set x = x + 1 %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ x }}{{ ns.n }}"),
            "03");
}

TEST(ChatTemplate, MacrosAndCall) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('a') }} {{ greet('b', punct='?') }}"),
            "Hi a! Hi b?");
  EXPECT_EQ(render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}in{% endcall %}"), "[in]");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(render("{% generation %}g{% endgeneration %}"), "g");
}

TEST(ChatTemplate, FiltersAndMethods) {
  Json ctx = {{"ms", {{{"role", "user"}, {"content", "u1"}}, {{"role", "bot"}, {"content", "b1"}}}}};
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}", ctx),
            "u1");
  EXPECT_EQ(render("{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}", ctx), "1");
  EXPECT_EQ(render("{{ ' x '.strip() }}{{ 'a</think>b'.split('</think>')[-1] }}{{ 'Ab'.lower() }}"
                   "{{ 'ab'.startswith('a') }}{{ 'a-b'.replace('-', '+') }}"),
            "xbabTruea+b");
  EXPECT_EQ(render("{{ {'b': 'é', 'a': [1, 2.5]} | tojson }}"), "{\"b\": \"é\", \"a\": [1, 2.5]}");
  EXPECT_EQ(render("{{ [1] | tojson(indent=2) }}"), "[\n  1\n]");
  EXPECT_EQ(render("{{ 'hello world' | title }} {{ 'x' | upper }} {{ [3, 1, 2] | sort | first }}"
                   " {{ [1, 2] | last }} {{ 2.5 | round }} {{ -1 | abs }} {{ '5' | int + 1 }}"),
            "Hello World X 1 2 2.0 1 6");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z', 'dz') }}{{ d.keys() | list }}", {{"d", {{"a", 1}}}}),
            "1dz['a']");
}

TEST(ChatTemplate, ContentIsNeverEvaluated) {
  ChatTemplate smol("{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(smol.render({{"user", "{{ 7 * 7 }}{% if %}"}}, false), "{{ 7 * 7 }}{% if %}");
}

TEST(ChatTemplate, MessagesOverloadAndPlainJson) {
  ChatTemplate t("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}");
  EXPECT_EQ(t.render({{"system", "s"}, {"user", "u"}}, true, "<s>", "</s>"), "<s><system>s<user>u<assistant></s>");
  nlohmann::json plain = {{"messages", nlohmann::json::array()}, {"add_generation_prompt", false}};
  EXPECT_EQ(t.render(plain), "");
  ChatTemplate moved = std::move(t);
  EXPECT_EQ(moved.render({{"user", "x"}}, false), "<user>x");
}

TEST(ChatTemplate, StrftimeNow) {
  std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(ChatTemplateErrors, SyntaxErrorsCarryPositions) {
  EXPECT_EQ(error_of("{% if x %}unclosed"),
            std::make_pair(ErrorCode::kInvalidModel,
                           std::string("chat template: unexpected end of template, expected 'elif' or "
                                       "'else' or 'endif' at line 1 column 19")));
  EXPECT_EQ(error_of("line one\n{{ 1 + }}"),
            std::make_pair(ErrorCode::kInvalidModel,
                           std::string("chat template: unexpected end of print statement, expected an "
                                       "expression at line 2 column 8")));
  EXPECT_EQ(error_of("{% foo %}").second, "chat template: unknown tag 'foo' at line 1 column 4");
  EXPECT_EQ(error_of("{{ 'abc }}").second, "chat template: unterminated string literal at line 1 column 4");
  EXPECT_EQ(error_of("ok\n{# never closed").second, "chat template: missing end of comment tag at line 2 column 1");
  EXPECT_EQ(error_of("{% break %}").second, "chat template: 'break' outside of a loop at line 1 column 4");
  EXPECT_EQ(error_of("{% for x in y %}{% endif %}").first, ErrorCode::kInvalidModel);
  EXPECT_EQ(error_of("{{ ) }}").first, ErrorCode::kInvalidModel);
}

TEST(ChatTemplateErrors, UnknownFilterOrTestAtParseTime) {
  EXPECT_EQ(error_of("\n  {{ x | nofilter }}"),
            std::make_pair(ErrorCode::kInvalidModel,
                           std::string("chat template: no filter named 'nofilter' at line 2 column 10")));
  EXPECT_EQ(error_of("{{ x is nosuchtest }}").second,
            "chat template: no test named 'nosuchtest' at line 1 column 9");
}

TEST(ChatTemplateErrors, RuntimeErrors) {
  EXPECT_EQ(error_of("{{ raise_exception('Conversation roles must alternate') }}"),
            std::make_pair(ErrorCode::kInvalidArgument, std::string("Conversation roles must alternate")));
  EXPECT_EQ(error_of("{{ u + 'a' }}"), std::make_pair(ErrorCode::kInvalidArgument, std::string("'u' is undefined")));
  EXPECT_EQ(error_of("{{ x.y.z }}", {{"x", Json::object()}}).second, "'dict object' has no attribute 'y'");
  EXPECT_EQ(error_of("{{ 1 / 0 }}").second, "division by zero");
  EXPECT_EQ(error_of("{{ 1 < 'a' }}").second, "'<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(error_of("{% set xs = [] %}{{ xs.append(1) }}").second,
            "access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(error_of("{% set n = 1 %}{% set n.a = 2 %}").second, "cannot assign attribute on non-namespace object");
  EXPECT_EQ(error_of("{% for a, b in [[1]] %}{% endfor %}").second,
            "not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(error_of("{{ 'a'.nosuchmethod() }}").first, ErrorCode::kInvalidArgument);
}

TEST(ChatTemplateErrors, BoundedRecursionAndSize) {
  auto [code, message] = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("recursion"), std::string::npos) << message;

  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(error_of(deep).first, ErrorCode::kInvalidModel);
  std::string deep_blocks;
  for (int i = 0; i < 2000; ++i) deep_blocks += "{% if true %}";
  EXPECT_EQ(error_of(deep_blocks).first, ErrorCode::kInvalidModel);

  EXPECT_EQ(error_of("{{ 'x' * 100000000000 }}").first, ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of("{{ range(100000000) | length }}").first, ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}")
                .first,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}").first,
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

// Found by chat_template_fuzz: number literals beyond int64/double range are
// syntax errors, not uncaught std::out_of_range.
TEST(ChatTemplateFuzzRegressions, HugeNumberLiteralsAreSyntaxErrors) {
  for (const char* source : {"{{ 99999999999999999999999 }}", "{{ x.99999999999999999999999 }}", "{{ 1e999999 }}"}) {
    try {
      ChatTemplate t(source);
      FAIL() << source;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidModel) << source;
    }
  }
}

// From a review of what a template in a model file can do: each of these
// crashed (SIGFPE, out-of-bounds read, stack overflow), hung or exhausted
// memory; now each is a clear error, or the right answer.
TEST(ChatTemplateFuzzRegressions, IntegerArithmeticIsCheckedNotWrapped) {
  for (const char* source : {"{{ (-9223372036854775807 - 1) // -1 }}", "{{ (-9223372036854775807 - 1) % -1 }}",
                             "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                             "{{ 4611686018427387904 * 2 }}", "{{ -(-9223372036854775807 - 1) }}", "{{ 2 ** 63 }}",
                             "{{ 3 ** 9223372036854775807 }}"}) {
    const auto [code, message] = error_of(source);
    EXPECT_EQ(code, ErrorCode::kInvalidArgument) << source;
    EXPECT_NE(message.find("overflow"), std::string::npos) << source << ": " << message;
  }
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ (-1) ** 9223372036854775807 }} {{ 7 ** 0 }} {{ -7 // 2 }}"),
            "4611686018427387904 -9223372036854775808 -1 1 -4");
}

TEST(ChatTemplateFuzzRegressions, HugeStepsEndSlicesAndRanges) {
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }}|{{ 'abc'[1::-9223372036854775807] }}"), "b|b");
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 9223372036854775807) | list }}"),
            "[9223372036854775806]");
}

TEST(ChatTemplateFuzzRegressions, StringsBuiltByRepeatingOrFormattingAreBounded) {
  for (const char* source : {"{{ ('x' * 16777216) * 1099511627776 }}", "{{ 'ab' * 9223372036854775807 }}",
                             "{{ ('{0}' * 1000000).format('x' * 1000) }}", "{{ '%s%s' % ('x' * 40000000, 'x' * 40000000) }}",
                             "{{ (['x' * 60000000] * 1000000) | length }}"}) {
    EXPECT_EQ(error_of(source).first, ErrorCode::kInvalidArgument) << source;
  }
}

TEST(ChatTemplateFuzzRegressions, WorkInsideExpressionsIsBudgeted) {
  // Within the statement budget (900k iterations), but each builds 6.4 MB:
  // hours of work before, a budget error after about 200 (the same rule
  // stops lists: range(100000) in that loop).
  for (const char* source :
       {"{% set s = 'x' * 100000 %}{% for i in range(900000) %}{% if (s * 64) | length %}{% endif %}{% endfor %}"}) {
    const auto [code, message] = error_of(source);
    EXPECT_EQ(code, ErrorCode::kInvalidArgument) << source;
    EXPECT_NE(message.find("execution budget"), std::string::npos) << message;
  }
}

TEST(ChatTemplateFuzzRegressions, LongOperatorChainsAreSyntaxErrorsNotDeepTrees) {
  std::string sum = "{{ 1";
  for (int i = 0; i < 200000; ++i) sum += "+1";
  EXPECT_EQ(error_of(sum + " }}").first, ErrorCode::kInvalidModel);
  EXPECT_EQ(error_of(sum + " + }}").first, ErrorCode::kInvalidModel);
  std::string conditions = "{{ 1";
  for (int i = 0; i < 100000; ++i) conditions += " if 1 else 1";
  EXPECT_EQ(error_of(conditions + " }}").first, ErrorCode::kInvalidModel);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|upper";
  EXPECT_EQ(error_of(filters + " }}").first, ErrorCode::kInvalidModel);
  // A chain real templates could write still parses and renders.
  std::string fine = "{{ 0";
  for (int i = 0; i < 100; ++i) fine += " + 1";
  EXPECT_EQ(render(fine + " }}"), "100");
}

}  // namespace
}  // namespace lazykv
