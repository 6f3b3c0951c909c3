// Ctrl-C in k3run (SIGINT): the first stops the current generation at the next token (a prompt
// run ends there with its report written, stop_reason "interrupted"; a chat answer ends and the
// prompt returns); a second one before the first was cleared ends the process the default way.
// At the chat prompt a first Ctrl-C only warns; a second exits.
// Thread safety: the flag is a lock-free atomic set by the handler and read by the caller.
#pragma once

namespace k3::run {

// Installs the handler (without SA_RESTART, so a read of the chat prompt returns EINTR).
void InstallInterruptHandler();
bool Interrupted();    // a Ctrl-C is pending
void ClearInterrupt();

}  // namespace k3::run
