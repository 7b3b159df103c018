package dev.kvshield.lease;

import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The lease table's capacity: its largest size still fits the records of its leases in one Java array. */
class LeaseTableTest {

    /** The lease table's most leases fit its record array (8 longs each) in one Java array. */
    @Test
    void theLargestLeaseTableFitsOneArray() {
        assertTrue(((long) dev.kvshield.lease.LeaseTable.MAX_CAPACITY << 3) < Integer.MAX_VALUE - 8);
    }
}
