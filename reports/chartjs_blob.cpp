// chart.min.js, copied into .rodata by the assembler (.incbin) so that the HTML report needs no file at run time.
//
// The path comes from FUSEKIT_CHARTJS_PATH (reports/CMakeLists.txt, which also makes this object depend on
// the file). The symbols are hidden: only chartjs_source() is visible outside the library.
#include "reports/chartjs.h"

#include <cstdint>

#ifndef FUSEKIT_CHARTJS_PATH
#error "FUSEKIT_CHARTJS_PATH must be the path of chart.min.js, as a string literal"
#endif

__asm__(
    ".pushsection .rodata, \"a\", @progbits\n"
    ".balign 16\n"
    ".globl fusekit_chartjs_begin\n"
    ".hidden fusekit_chartjs_begin\n"
    ".type fusekit_chartjs_begin, @object\n"
    "fusekit_chartjs_begin:\n"
    ".incbin \"" FUSEKIT_CHARTJS_PATH
    "\"\n"
    ".globl fusekit_chartjs_end\n"
    ".hidden fusekit_chartjs_end\n"
    ".type fusekit_chartjs_end, @object\n"
    "fusekit_chartjs_end:\n"
    ".byte 0\n"
    ".size fusekit_chartjs_begin, fusekit_chartjs_end - fusekit_chartjs_begin\n"
    ".popsection\n");

extern "C" const char fusekit_chartjs_begin[];
extern "C" const char fusekit_chartjs_end[];

namespace fusekit::reports {

std::string_view chartjs_source() {
  // Two symbols, not one array: compare addresses as integers, not as pointers into different objects.
  const auto size =
      reinterpret_cast<uintptr_t>(fusekit_chartjs_end) - reinterpret_cast<uintptr_t>(fusekit_chartjs_begin);
  return {fusekit_chartjs_begin, static_cast<size_t>(size)};
}

}  // namespace fusekit::reports
