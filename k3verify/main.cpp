#include "k3verify/cli.h"

int main(int argc, char** argv) { return k3::verify::Main(argc, argv); }
