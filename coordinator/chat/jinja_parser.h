// Parses template tokens into a syntax tree. Filter and test names are
// checked here, as jinja2 checks them when it compiles a template.
#pragma once

#include <string>

#include "coordinator/chat/jinja_ast.h"

namespace lazykv::jinja {

// Throws Error(kInvalidModel, "chat template: ... at line L column C").
Body parse_template(const std::string& source);

}  // namespace lazykv::jinja
