#include "coordinator/chat/jinja_parser.h"

#include <initializer_list>
#include <string_view>

#include "coordinator/chat/jinja_builtins.h"
#include "coordinator/chat/jinja_lexer.h"

namespace lazykv::jinja {
namespace {

// Deeper nesting than this is rejected instead of overflowing the stack.
constexpr int kMaxNesting = 128;
// Links of operator chains (a + b + c, x|f|g, a.b[0](c)) on the way to a
// node: each is one more level of the tree, which evaluation and destruction
// walk recursively, so it is bounded as nesting is.
constexpr int kMaxChainLinks = 256;  // well below the evaluator's depth limit (500), so what parses renders

using T = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    std::string found;
    Body body = parse_body({}, found);
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().type == T::kOperator && cur().value == op; }
  bool is_name(std::string_view name) const { return cur().type == T::kName && cur().value == name; }

  static std::string describe(const Token& token) {
    switch (token.type) {
      case T::kText: return "text";
      case T::kVariableBegin: return "'{{'";
      case T::kVariableEnd: return "end of print statement";
      case T::kBlockBegin: return "'{%'";
      case T::kBlockEnd: return "end of statement block";
      case T::kString: return "string";
      case T::kEnd: return "end of template";
      default: return "'" + token.value + "'";
    }
  }

  [[noreturn]] void fail_at(const std::string& message, const Token& token) const {
    syntax_error(message, token.line, token.column);
  }
  [[noreturn]] void unexpected(const std::string& expected = "") const {
    fail_at("unexpected " + describe(cur()) + (expected.empty() ? "" : ", expected " + expected), cur());
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) unexpected("'" + std::string(op) + "'");
    advance();
  }
  void expect(T type, const std::string& what) {
    if (cur().type != type) unexpected(what);
    advance();
  }
  void expect_block_end() { expect(T::kBlockEnd, "end of statement block"); }
  std::string expect_identifier() {
    if (cur().type != T::kName) unexpected("a name");
    std::string name = cur().value;
    advance();
    return name;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxNesting) parser.fail_at("template nested too deeply", parser.cur());
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // Counts the links one chain adds (next() per node it builds); they stay
  // counted for everything parsed inside, until the chain's function returns.
  struct ChainGuard {
    explicit ChainGuard(Parser& p) : parser(p) {}
    void next() {
      ++links;
      if (++parser.chain_links_ > kMaxChainLinks) parser.fail_at("expression too long or nested too deeply", parser.cur());
    }
    ~ChainGuard() { parser.chain_links_ -= links; }
    Parser& parser;
    int links = 0;
  };

  template <typename N>
  static std::unique_ptr<N> make(typename N::Kind kind, const Token& at) {
    auto node = std::make_unique<N>();
    node->kind = kind;
    node->line = at.line;
    node->column = at.column;
    return node;
  }

  // ---- statements ----
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string& found) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& token = cur();
      switch (token.type) {
        case T::kEnd:
          if (end_tags.size() != 0) {
            std::string expected;
            for (std::string_view tag : end_tags) expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
            fail_at("unexpected end of template, expected " + expected, token);
          }
          return body;
        case T::kText: {
          auto node = make<Node>(Node::Kind::kText, token);
          node->text = token.value;
          body.push_back(std::move(node));
          advance();
          break;
        }
        case T::kVariableBegin: {
          auto node = make<Node>(Node::Kind::kOutput, token);
          advance();
          node->expr = parse_tuple(true);
          expect(T::kVariableEnd, "end of print statement");
          body.push_back(std::move(node));
          break;
        }
        case T::kBlockBegin: {
          const Token& name = peek();
          if (name.type != T::kName) {
            advance();
            unexpected("a tag name");
          }
          for (std::string_view tag : end_tags) {
            if (name.value == tag) {
              found = name.value;
              advance();
              advance();
              return body;
            }
          }
          advance();
          body.push_back(parse_statement());
          break;
        }
        default: unexpected();
      }
    }
  }

  NodePtr parse_statement() {
    const Token& tag = cur();
    std::string name = tag.value;
    advance();
    if (name == "if") return parse_if(tag);
    if (name == "for") return parse_for(tag);
    if (name == "set") return parse_set(tag);
    if (name == "macro") return parse_macro(tag);
    if (name == "call") return parse_call_block(tag);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at("'" + name + "' outside of a loop", tag);
      auto node = make<Node>(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, tag);
      expect_block_end();
      return node;
    }
    if (name == "generation") {  // Hugging Face's assistant-mask tag: renders its body
      auto node = make<Node>(Node::Kind::kScope, tag);
      expect_block_end();
      std::string found;
      node->body = parse_body({"endgeneration"}, found);
      expect_block_end();
      return node;
    }
    fail_at("unknown tag '" + name + "'", tag);
  }

  NodePtr parse_if(const Token& tag) {
    auto node = make<Node>(Node::Kind::kIf, tag);
    ExprPtr condition = parse_tuple(false);
    while (true) {
      expect_block_end();
      std::string found;
      Body body = parse_body({"elif", "else", "endif"}, found);
      node->branches.emplace_back(std::move(condition), std::move(body));
      if (found == "elif") {
        condition = parse_tuple(false);
        continue;
      }
      if (found == "else") {
        expect_block_end();
        node->else_body = parse_body({"endif"}, found);
      }
      expect_block_end();
      return node;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> targets;
    bool parenthesized = is_op("(");
    if (parenthesized) advance();
    targets.push_back(expect_identifier());
    while (is_op(",")) {
      advance();
      if (cur().type != T::kName || is_name("in")) break;
      targets.push_back(expect_identifier());
    }
    if (parenthesized) expect_op(")");
    return targets;
  }

  NodePtr parse_for(const Token& tag) {
    auto node = make<Node>(Node::Kind::kFor, tag);
    node->targets = parse_targets();
    if (!is_name("in")) unexpected("'in'");
    advance();
    node->expr = parse_tuple(false, {"if", "recursive"});
    if (is_name("if")) {
      advance();
      node->filter = parse_expression(true);
    }
    if (is_name("recursive")) fail_at("recursive loops are not supported", cur());
    expect_block_end();
    ++loop_depth_;
    std::string found;
    node->body = parse_body({"else", "endfor"}, found);
    --loop_depth_;
    if (found == "else") {
      expect_block_end();
      node->else_body = parse_body({"endfor"}, found);
    }
    expect_block_end();
    return node;
  }

  NodePtr parse_set(const Token& tag) {
    auto node = make<Node>(Node::Kind::kSet, tag);
    node->targets.push_back(expect_identifier());
    if (is_op(".")) {
      advance();
      node->attribute = expect_identifier();
    } else {
      while (is_op(",")) {
        advance();
        node->targets.push_back(expect_identifier());
      }
    }
    if (is_op("=")) {
      advance();
      node->expr = parse_tuple(true);
      expect_block_end();
      return node;
    }
    if (node->targets.size() != 1 || !node->attribute.empty()) unexpected("'='");
    node->kind = Node::Kind::kSetBlock;
    expect_block_end();
    std::string found;
    node->body = parse_body({"endset"}, found);
    expect_block_end();
    return node;
  }

  void parse_params(Node& node) {
    expect_op("(");
    while (!is_op(")")) {
      if (!node.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string param = expect_identifier();
      ExprPtr default_value;
      if (is_op("=")) {
        advance();
        default_value = parse_expression(true);
      }
      node.params.emplace_back(std::move(param), std::move(default_value));
    }
    advance();
  }

  NodePtr parse_macro(const Token& tag) {
    auto node = make<Node>(Node::Kind::kMacro, tag);
    node->name = expect_identifier();
    parse_params(*node);
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string found;
    node->body = parse_body({"endmacro"}, found);
    loop_depth_ = saved_loop_depth;
    if (cur().type == T::kName) advance();  // {% endmacro name %}
    expect_block_end();
    return node;
  }

  NodePtr parse_call_block(const Token& tag) {
    auto node = make<Node>(Node::Kind::kCallBlock, tag);
    if (is_op("(")) parse_params(*node);
    node->expr = parse_expression(true);
    if (node->expr->kind != Expr::Kind::kCall) fail_at("expected a call after 'call'", tag);
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string found;
    node->body = parse_body({"endcall"}, found);
    loop_depth_ = saved_loop_depth;
    expect_block_end();
    return node;
  }

  // ---- expressions ----
  bool at_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    if (cur().type == T::kVariableEnd || cur().type == T::kBlockEnd || is_op(")")) return true;
    for (std::string_view name : extra_end)
      if (is_name(name)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condition, std::initializer_list<std::string_view> extra_end = {}) {
    const Token& start = cur();
    ExprPtr first = parse_expression(with_condition);
    if (!is_op(",")) return first;
    auto tuple = make<Expr>(Expr::Kind::kList, start);
    tuple->items.push_back(std::move(first));
    while (is_op(",")) {
      advance();
      if (at_tuple_end(extra_end)) break;
      tuple->items.push_back(parse_expression(with_condition));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condition) {
    return with_condition ? parse_condition() : parse_or();
  }

  ExprPtr parse_condition() {
    ChainGuard chain(*this);
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      chain.next();
      const Token& at = cur();
      advance();
      auto node = make<Expr>(Expr::Kind::kCondition, at);
      node->items.push_back(parse_or());
      node->items.push_back(std::move(expr));
      if (is_name("else")) {
        advance();
        DepthGuard guard(*this);  // a else b if c else d ...: recursion
        node->items.push_back(parse_condition());
      } else {
        node->items.push_back(nullptr);
      }
      expr = std::move(node);
    }
    return expr;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr left, ExprPtr right, const Token& at) {
    auto node = make<Expr>(kind, at);
    node->name = std::move(op);
    node->items.push_back(std::move(left));
    node->items.push_back(std::move(right));
    return node;
  }

  ExprPtr parse_or() {
    ChainGuard chain(*this);
    ExprPtr left = parse_and();
    while (is_name("or")) {
      chain.next();
      const Token& at = cur();
      advance();
      left = binary(Expr::Kind::kOr, "or", std::move(left), parse_and(), at);
    }
    return left;
  }

  ExprPtr parse_and() {
    ChainGuard chain(*this);
    ExprPtr left = parse_not();
    while (is_name("and")) {
      chain.next();
      const Token& at = cur();
      advance();
      left = binary(Expr::Kind::kAnd, "and", std::move(left), parse_not(), at);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    DepthGuard guard(*this);
    auto node = make<Expr>(Expr::Kind::kUnary, cur());
    node->name = "not";
    advance();
    node->items.push_back(parse_not());
    return node;
  }

  ExprPtr parse_compare() {
    ChainGuard chain(*this);
    ExprPtr left = parse_math1();
    while (true) {
      const Token& at = cur();
      std::string op;
      if (cur().type == T::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == T::kName && peek().value == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        return left;
      }
      chain.next();
      left = binary(Expr::Kind::kBinary, op, std::move(left), parse_math1(), at);
    }
  }

  ExprPtr parse_math1() {
    ChainGuard chain(*this);
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      chain.next();
      const Token& at = cur();
      std::string op = cur().value;
      advance();
      left = binary(Expr::Kind::kBinary, op, std::move(left), parse_concat(), at);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ChainGuard chain(*this);
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      chain.next();
      const Token& at = cur();
      advance();
      left = binary(Expr::Kind::kBinary, "~", std::move(left), parse_math2(), at);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ChainGuard chain(*this);
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.next();
      const Token& at = cur();
      std::string op = cur().value;
      advance();
      left = binary(Expr::Kind::kBinary, op, std::move(left), parse_pow(), at);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ChainGuard chain(*this);
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      chain.next();
      const Token& at = cur();
      advance();
      left = binary(Expr::Kind::kBinary, "**", std::move(left), parse_unary(true), at);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make<Expr>(Expr::Kind::kUnary, cur());
      node->name = cur().value;
      advance();
      node->items.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr literal(Json value, const Token& at) {
    auto node = make<Expr>(Expr::Kind::kLiteral, at);
    node->literal = std::move(value);
    return node;
  }

  ExprPtr parse_primary() {
    const Token& token = cur();
    switch (token.type) {
      case T::kName: {
        advance();
        if (token.value == "true" || token.value == "True") return literal(true, token);
        if (token.value == "false" || token.value == "False") return literal(false, token);
        if (token.value == "none" || token.value == "None") return literal(nullptr, token);
        auto node = make<Expr>(Expr::Kind::kName, token);
        node->name = token.value;
        return node;
      }
      case T::kString: {
        std::string value;
        while (cur().type == T::kString) {  // adjacent literals concatenate
          value += cur().value;
          advance();
        }
        return literal(value, token);
      }
      case T::kInteger: {
        advance();
        try {
          return literal(std::stoll(token.value), token);
        } catch (const std::out_of_range&) {
          fail_at("integer literal too large", token);
        }
      }
      case T::kFloat: {
        advance();
        try {
          return literal(std::stod(token.value), token);
        } catch (const std::out_of_range&) {
          fail_at("float literal out of range", token);
        }
      }
      case T::kOperator:
        if (token.value == "(") return parse_parenthesized();
        if (token.value == "[") return parse_list();
        if (token.value == "{") return parse_dict();
        break;
      default: break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_parenthesized() {
    const Token& open = cur();
    advance();
    if (is_op(")")) {
      advance();
      return make<Expr>(Expr::Kind::kList, open);  // empty tuple
    }
    ExprPtr expr = parse_expression(true);
    if (is_op(",")) {
      auto tuple = make<Expr>(Expr::Kind::kList, open);
      tuple->items.push_back(std::move(expr));
      while (is_op(",")) {
        advance();
        if (is_op(")")) break;
        tuple->items.push_back(parse_expression(true));
      }
      expr = std::move(tuple);
    }
    expect_op(")");
    return expr;
  }

  ExprPtr parse_list() {
    auto node = make<Expr>(Expr::Kind::kList, cur());
    advance();
    while (!is_op("]")) {
      if (!node->items.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      node->items.push_back(parse_expression(true));
    }
    advance();
    return node;
  }

  ExprPtr parse_dict() {
    auto node = make<Expr>(Expr::Kind::kDict, cur());
    advance();
    while (!is_op("}")) {
      if (!node->items.empty()) {
        expect_op(",");
        if (is_op("}")) break;
      }
      node->items.push_back(parse_expression(true));
      expect_op(":");
      node->items.push_back(parse_expression(true));
    }
    advance();
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    ChainGuard chain(*this);
    while (true) {
      const Token& at = cur();
      if (is_op(".") || is_op("[") || is_op("(")) chain.next();
      if (is_op(".")) {
        advance();
        if (cur().type == T::kName) {
          auto attr = make<Expr>(Expr::Kind::kAttribute, at);
          attr->name = cur().value;
          attr->items.push_back(std::move(node));
          node = std::move(attr);
        } else if (cur().type == T::kInteger) {
          auto index = make<Expr>(Expr::Kind::kIndex, at);
          index->items.push_back(std::move(node));
          try {
            index->items.push_back(literal(std::stoll(cur().value), cur()));
          } catch (const std::out_of_range&) {
            fail_at("integer literal too large", cur());
          }
          node = std::move(index);
        } else {
          unexpected("an attribute name");
        }
        advance();
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    const Token& at = cur();
    advance();
    ExprPtr start;
    if (!is_op(":")) start = parse_expression(true);
    if (!is_op(":")) {
      expect_op("]");
      auto node = make<Expr>(Expr::Kind::kIndex, at);
      node->items.push_back(std::move(target));
      node->items.push_back(std::move(start));
      return node;
    }
    advance();
    auto node = make<Expr>(Expr::Kind::kSlice, at);
    node->items.push_back(std::move(target));
    node->items.push_back(std::move(start));
    node->items.push_back(is_op("]") || is_op(":") ? nullptr : parse_expression(true));
    if (is_op(":")) {
      advance();
      node->items.push_back(is_op("]") ? nullptr : parse_expression(true));
    } else {
      node->items.push_back(nullptr);
    }
    expect_op("]");
    return node;
  }

  void parse_call_args(Expr& node) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail_at("*args and **kwargs are not supported", cur());
      if (cur().type == T::kName && peek().type == T::kOperator && peek().value == "=") {
        std::string name = cur().value;
        advance();
        advance();
        node.named.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!node.named.empty()) fail_at("positional argument after keyword argument", cur());
        node.items.push_back(parse_expression(true));
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto node = make<Expr>(Expr::Kind::kCall, cur());
    node->items.push_back(std::move(callee));
    parse_call_args(*node);
    return node;
  }

  std::string parse_dotted_name() {
    std::string name = expect_identifier();
    while (is_op(".")) {
      advance();
      name += '.';
      name += expect_identifier();
    }
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    ChainGuard chain(*this);
    while (true) {
      if (is_op("|") || is_name("is") || is_op("(")) chain.next();
      if (is_op("|")) {
        advance();
        const Token& at = cur();
        auto filter = make<Expr>(Expr::Kind::kFilter, at);
        filter->name = parse_dotted_name();
        if (!has_filter(filter->name)) fail_at("no filter named '" + filter->name + "'", at);
        filter->items.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*filter);
        node = std::move(filter);
      } else if (is_name("is")) {
        advance();
        auto test = make<Expr>(Expr::Kind::kTest, cur());
        if (is_name("not")) {
          test->negated = true;
          advance();
        }
        const Token& at = cur();
        test->name = parse_dotted_name();
        if (!has_test(test->name)) fail_at("no test named '" + test->name + "'", at);
        test->items.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(*test);
        } else if ((cur().type == T::kName || cur().type == T::kString || cur().type == T::kInteger ||
                    cur().type == T::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail_at("cannot chain multiple tests with 'is'", cur());
          test->items.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(test);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int chain_links_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace lazykv::jinja
