"""A server's attestation (what its indexer really ran) against a configuration's label.

niah.attestation.format is the record servers report (niah.serving.sglang.attest produces
it); niah.attestation.readings reads a server and turns readings into manifest changes;
niah.attestation.rules judges a configuration (`status`: "valid", "INVALID" or
"unattested"); niah.attestation.verdict refuses, summarises and says (`shown_state`: "n/a"
for a server that attested nothing). Pure: nothing here
writes; the run folder (niah.runs.manifest) stores what readings return.
"""

from niah.attestation.format import FIELD, from_server_info
from niah.attestation.readings import (begin_segment, end_segment, open_segment, read_server, reading_of,
                                      start_contradiction)
from niah.attestation.rules import INVALID, UNATTESTED, VALID, last_attestation, status
from niah.attestation.verdict import (ACCEPT_FLAG, NOT_ATTESTED, check_baseline, check_configs, counts,
                                     planted_faults, report_section, say_state, shown_state)

__all__ = ["ACCEPT_FLAG", "FIELD", "INVALID", "NOT_ATTESTED", "UNATTESTED", "VALID", "begin_segment",
           "check_baseline", "check_configs", "counts", "end_segment", "from_server_info", "last_attestation",
           "open_segment", "planted_faults", "read_server", "reading_of", "report_section", "say_state",
           "shown_state", "start_contradiction", "status"]
