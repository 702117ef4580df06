// Short kernel names that stay distinct, for the HTML report's labels (the full name goes in the tooltip).
//
// A kernel's short name is profiler::short_kernel_name: no namespaces, template arguments, parameters or
// return type ("layernorm_forward_kernel", "elementwise_kernel"). Where several of the names given share a
// short name, each of them gets a summary of its template arguments: the words of the arguments
// (identifiers without their namespaces and enclosing scopes, numbers without their u/l suffixes, casts
// such as "(SoftmaxMask)1" as one word; "void", "const" and the like left out) are lined up by position,
// and a name shows, from the first position on, its word at each position where one of the names that
// matched it so far differs, until no other name is left: "layernorm_forward_kernel<3, 8, false>",
// "vectorized_elementwise_kernel<8, CUDAFunctor_add>", "vectorized_elementwise_kernel<4, FillFunctor, int>".
// Names whose words are the same (lambdas that differ only in their ordinal) add the lambdas' ordinals as
// words ("lambda#2"); names that still collide get their whole name without namespaces, then the whole
// name. Labels never carry a counter ("#2") that the names do not hold.
#pragma once

#include <string>
#include <vector>

namespace fusekit::reports {

// One label per name, in the same order: distinct for distinct names (equal names get equal labels).
std::vector<std::string> distinct_short_names(const std::vector<std::string>& names);

// The words of a name's template arguments as described above; with `lambda_ordinals`, "lambda#N" words
// too. Exposed for the tests.
std::vector<std::string> template_argument_words(const std::string& name, bool lambda_ordinals);

}  // namespace fusekit::reports
