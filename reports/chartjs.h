// Chart.js (Debian's libjs-chart.js 3.9.1, chart.min.js), embedded in the binary at build time.
#pragma once

#include <string_view>

namespace fusekit::reports {

// The whole of chart.min.js, licence comment included.
std::string_view chartjs_source();

}  // namespace fusekit::reports
