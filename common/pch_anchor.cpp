// common/pch_anchor.cpp: an empty translation unit that owns the shared torch PCH.
