#include "coordinator/chat/jinja_interpreter.h"

#include <unordered_map>

#include "coordinator/chat/jinja_builtins.h"

namespace lazykv::jinja {
namespace {

// A variable scope: the template root, one loop iteration, or a macro call.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  explicit Interpreter(const Json& context) : root_(std::make_shared<Frame>()) {
    for (auto& [name, fn] : global_functions()) root_->vars[name] = std::move(fn);
    if (!context.is_object()) fail("chat template context must be an object");
    // One copy of the context; variables alias it so lookups never copy messages.
    Value holder(context);
    for (const auto& [name, value] : holder.json().items()) root_->vars[name] = Value::child(holder, value);
  }

  std::string run(const Body& program) {
    std::string out;
    exec_body(program, root_, out);
    return out;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Interpreter& in) : interpreter(in) {
      if (++interpreter.depth_ > kMaxEvalDepth) fail("maximum recursion depth exceeded in chat template");
    }
    ~DepthGuard() { --interpreter.depth_; }
    Interpreter& interpreter;
  };

  void step() {
    if (++steps_ > kMaxSteps) fail("chat template exceeded its execution budget");
  }

  void charge(uint64_t units) {
    work_ += units;
    if (work_ > kMaxWork) fail("chat template exceeded its execution budget (work inside expressions)");
  }
  // What building `v` cost: its items, or its bytes in units of 64.
  static uint64_t size_units(const Value& v) {
    if (!v.is_json()) return 0;
    const Json& j = v.json();
    if (j.is_string()) return j.get_ref<const std::string&>().size() / 64;
    return j.is_array() || j.is_object() ? j.size() : 0;
  }
  Value produced(Value v) {
    charge(size_units(v));
    return v;
  }

  static void append(std::string& out, std::string_view text) {
    if (out.size() + text.size() > kMaxOutputBytes)
      fail("chat template output exceeds " + std::to_string(kMaxOutputBytes) + " bytes");
    out += text;
  }

  static Value lookup(const FramePtr& frame, const std::string& name) {
    for (const Frame* f = frame.get(); f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  // ---- statements ----
  Flow exec_body(const Body& body, const FramePtr& frame, std::string& out) {
    DepthGuard guard(*this);
    for (const NodePtr& node : body) {
      Flow flow = exec(*node, frame, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& node, const FramePtr& frame, std::string& out) {
    step();
    switch (node.kind) {
      case Node::Kind::kText: append(out, node.text); return Flow::kNormal;
      case Node::Kind::kOutput: append(out, py_str(eval(*node.expr, frame))); return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches)
          if (truthy(eval(*condition, frame))) return exec_body(body, frame, out);
        return exec_body(node.else_body, frame, out);
      case Node::Kind::kFor: exec_for(node, frame, out); return Flow::kNormal;
      case Node::Kind::kSet: exec_set(node, frame); return Flow::kNormal;
      case Node::Kind::kSetBlock: {
        std::string captured;
        exec_body(node.body, frame, captured);
        frame->vars[node.targets[0]] = Value(captured);
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: frame->vars[node.name] = make_macro(node, frame); return Flow::kNormal;
      case Node::Kind::kCallBlock: {
        auto caller = std::make_shared<Callable>();
        caller->name = "caller";
        const Node* block = &node;
        std::weak_ptr<Frame> calling = frame;  // weak: the caller may be stored in that frame
        caller->call = [this, block, calling](CallArgs& args) -> Value {
          FramePtr scope = calling.lock();
          return Value(invoke_body(*block, scope ? scope : root_, args));
        };
        const Expr& call = *node.expr;
        Value callee = eval(*call.items[0], frame);
        CallArgs args = eval_args(call, frame);
        args.named.emplace_back("caller", Value::from_callable(caller));
        append(out, py_str(call_value(callee, args)));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kScope: return exec_body(node.body, frame, out);
    }
    return Flow::kNormal;
  }

  static void bind_targets(const std::vector<std::string>& targets, const Value& value, Frame& frame) {
    if (targets.size() == 1) {
      frame.vars[targets[0]] = value;
      return;
    }
    std::vector<Value> items = iterate(value);
    if (items.size() != targets.size())
      fail(std::string(items.size() < targets.size() ? "not enough" : "too many") +
           " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
           std::to_string(items.size()) + ")");
    for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
  }

  void exec_for(const Node& node, const FramePtr& frame, std::string& out) {
    Value iterable = eval(*node.expr, frame);
    std::vector<Value> items = iterate(iterable);
    if (node.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        step();
        auto scope = std::make_shared<Frame>();
        scope->parent = frame;
        bind_targets(node.targets, item, *scope);
        if (truthy(eval(*node.filter, scope))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(node.else_body, frame, out);
      return;
    }
    const auto length = static_cast<int64_t>(items.size());
    auto shared_items = std::make_shared<const std::vector<Value>>(std::move(items));
    for (int64_t i = 0; i < length; ++i) {
      step();
      auto scope = std::make_shared<Frame>();
      scope->parent = frame;
      auto loop = std::make_shared<Namespace>();
      loop->assignable = false;
      loop->loop = LoopState{i, shared_items};
      scope->vars["loop"] = Value::from_namespace(loop);
      bind_targets(node.targets, (*shared_items)[static_cast<size_t>(i)], *scope);
      if (exec_body(node.body, scope, out) == Flow::kBreak) break;
    }
  }

  void exec_set(const Node& node, const FramePtr& frame) {
    Value value = eval(*node.expr, frame);
    if (!node.attribute.empty()) {
      Value target = lookup(frame, node.targets[0]);
      if (target.kind() != Value::Kind::kNamespace || !target.ns().assignable)
        fail("cannot assign attribute on non-namespace object");
      target.ns().set(node.attribute, std::move(value));
      return;
    }
    bind_targets(node.targets, value, *frame);
  }

  // Renders a macro or call-block body with its parameters bound from args.
  std::string invoke_body(const Node& node, const FramePtr& defining, CallArgs& args) {
    DepthGuard guard(*this);
    auto scope = std::make_shared<Frame>();
    scope->parent = defining;
    const std::string& name = node.kind == Node::Kind::kMacro ? node.name : std::string("caller");
    if (args.positional.size() > node.params.size())
      fail("macro '" + name + "' takes not more than " + std::to_string(node.params.size()) + " argument(s)");
    for (size_t i = 0; i < node.params.size(); ++i) {
      const auto& [param, default_value] = node.params[i];
      if (i < args.positional.size()) {
        scope->vars[param] = args.positional[i];
      } else if (default_value) {
        scope->vars[param] = eval(*default_value, scope);
      } else {
        scope->vars[param] = Value::undefined("parameter '" + param + "' was not provided");
      }
    }
    for (auto& [key, value] : args.named) {
      bool known = key == "caller";
      for (const auto& [param, default_value] : node.params) known = known || param == key;
      if (!known) fail("macro '" + name + "' takes no keyword argument '" + key + "'");
      scope->vars[key] = value;
    }
    std::string out;
    exec_body(node.body, scope, out);
    return out;
  }

  Value make_macro(const Node& node, const FramePtr& frame) {
    auto fn = std::make_shared<Callable>();
    fn->name = node.name;
    const Node* macro = &node;
    // A weak link: the macro lives in this frame, a strong one would be a cycle.
    // Calls happen only while this interpreter renders, so `this` outlives them.
    std::weak_ptr<Frame> defining = frame;
    fn->call = [this, macro, defining](CallArgs& args) -> Value {
      FramePtr scope = defining.lock();
      return Value(invoke_body(*macro, scope ? scope : root_, args));
    };
    return Value::from_callable(fn);
  }

  // ---- expressions ----
  CallArgs eval_args(const Expr& expr, const FramePtr& frame, size_t first = 1) {
    CallArgs args;
    for (size_t i = first; i < expr.items.size(); ++i) args.positional.push_back(eval(*expr.items[i], frame));
    for (const auto& [name, value] : expr.named) args.named.emplace_back(name, eval(*value, frame));
    return args;
  }

  static Value call_value(const Value& callee, CallArgs& args) {
    require_defined(callee);
    if (callee.kind() != Value::Kind::kCallable) fail("'" + type_name(callee) + "' object is not callable");
    return callee.fn().call(args);
  }

  Value eval(const Expr& expr, const FramePtr& frame) {
    DepthGuard guard(*this);
    charge(1);
    switch (expr.kind) {
      case Expr::Kind::kLiteral: return Value(expr.literal);
      case Expr::Kind::kName: return lookup(frame, expr.name);
      case Expr::Kind::kList: {
        Json list = Json::array();
        for (const ExprPtr& item : expr.items) list.push_back(eval(*item, frame).to_json());
        return list;
      }
      case Expr::Kind::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
          Value key = eval(*expr.items[i], frame);
          require_defined(key);
          dict[key.is_string() ? key.str() : py_str(key)] = eval(*expr.items[i + 1], frame).to_json();
        }
        return dict;
      }
      case Expr::Kind::kAttribute: return get_attribute(eval(*expr.items[0], frame), expr.name);
      case Expr::Kind::kIndex: {
        Value object = eval(*expr.items[0], frame);
        if (object.is_string()) charge(size_units(object));  // a string is indexed by code point: a scan
        return produced(get_item(object, eval(*expr.items[1], frame)));
      }
      case Expr::Kind::kSlice: {
        Value object = eval(*expr.items[0], frame);
        auto part = [&](size_t i) { return expr.items[i] ? eval(*expr.items[i], frame) : Value(nullptr); };
        return produced(get_slice(object, part(1), part(2), part(3)));
      }
      case Expr::Kind::kCall: {
        Value callee = eval(*expr.items[0], frame);
        CallArgs args = eval_args(expr, frame);
        return produced(call_value(callee, args));
      }
      case Expr::Kind::kFilter: {
        Value input = eval(*expr.items[0], frame);
        return produced(apply_filter(expr.name, input, eval_args(expr, frame)));
      }
      case Expr::Kind::kTest: {
        Value subject = eval(*expr.items[0], frame);
        return apply_test(expr.name, subject, eval_args(expr, frame)) != expr.negated;
      }
      case Expr::Kind::kUnary: {
        Value operand = eval(*expr.items[0], frame);
        if (expr.name == "not") return !truthy(operand);
        if (expr.name == "-") return negate(operand);
        require_defined(operand);
        if (!operand.is_number()) fail("bad operand type for unary +: '" + type_name(operand) + "'");
        return operand;
      }
      case Expr::Kind::kBinary:
        return produced(binary_op(expr.name, eval(*expr.items[0], frame), eval(*expr.items[1], frame)));
      case Expr::Kind::kAnd: {
        Value left = eval(*expr.items[0], frame);
        return truthy(left) ? eval(*expr.items[1], frame) : left;
      }
      case Expr::Kind::kOr: {
        Value left = eval(*expr.items[0], frame);
        return truthy(left) ? left : eval(*expr.items[1], frame);
      }
      case Expr::Kind::kCondition:
        if (truthy(eval(*expr.items[0], frame))) return eval(*expr.items[1], frame);
        if (expr.items[2]) return eval(*expr.items[2], frame);
        return Value::undefined("the inline if-expression on line " + std::to_string(expr.line) +
                                " evaluated to false and no else section was defined.");
    }
    return Value();
  }

  FramePtr root_;
  int depth_ = 0;
  uint64_t steps_ = 0;
  uint64_t work_ = 0;
};

}  // namespace

std::string render(const Body& program, const Json& context) {
  Interpreter interpreter(context);
  return interpreter.run(program);
}

}  // namespace lazykv::jinja
