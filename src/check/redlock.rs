//! The checkers of lab `redlock`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
