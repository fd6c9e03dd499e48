package limiter

// GrantsIn is grantsIn, for the differential test in package
// limiter_test (which imports internal/fleetref, which imports limiter).
var GrantsIn = grantsIn
