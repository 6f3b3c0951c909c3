// k3run: a thin main over the engine library (k3run/app/cli.h).
#include "k3run/app/cli.h"

int main(int argc, char** argv) { return k3::run::K3runMain(argc, argv); }
