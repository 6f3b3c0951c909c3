#pragma once
#include "k3run/engine/model.h"  // upward: ops may not see the engine
