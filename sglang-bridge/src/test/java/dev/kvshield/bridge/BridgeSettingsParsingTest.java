package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import java.math.BigDecimal;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Each setting is read exactly or refused naming it: found by attack, a level with a control character or a look-alike
 * letter ran as the level it resembled (Java's trim() drops every character up to U+0020, toUpperCase folds {@code ı}
 * to {@code I}) where the plug-in's own reading of KVSHIELD_LEVEL saw another level, and other scripts' digits were
 * read as numbers.
 */
class BridgeSettingsParsingTest {
    private static IllegalArgumentException refused(String key, String value) {
        return assertThrows(IllegalArgumentException.class, () -> BridgeSettings.parse(Map.of(key, value)), key + "=" + value);
    }

    @Test
    void aLevelIsItsNameInAnyAsciiCaseBetweenBlanksAnEnvFileLeaves() {
        assertEquals(ProtectionLevel.ZERO, BridgeSettings.parse(Map.of("level", "zero")).level);
        assertEquals(ProtectionLevel.NONE, BridgeSettings.parse(Map.of("level", " None\r\n")).level);
        assertEquals(ProtectionLevel.ZERO, BridgeSettings.parse(Map.of()).level);
    }

    @Test
    void aLevelWithAControlCharacterOrALookAlikeLetterIsRefusedShownEscaped() {
        for (String v : new String[] {"COMPLIANCE\u0001", "\u001fCOMPLIANCE", "COMPL\u0131ANCE", "ZER\u039f", "N\u00a0ONE", "NONE\u200b"}) {
            String m = refused("level", v).getMessage();
            assertTrue(m.startsWith("level "), m);
            assertFalse(m.chars().anyMatch(c -> c < 0x20 || c >= 0x7f), "the refusal shows the value escaped: " + m);
        }
        assertTrue(refused("level", "COMPL\u0131ANCE").getMessage().endsWith(": 'COMPL\\u0131ANCE'"));
        assertTrue(refused("level", "ZER\u039f").getMessage().contains("must be one of [NONE, ZERO, ENCRYPT, COMPLIANCE]: 'ZER\\u039f'"));
    }

    @Test
    void anEmptySettingIsRefusedNotReadAsItsDefault() {
        for (String key : new String[] {"level", "strict", "quarantine", "auditDir", "auditSigningKey", "auditShip", "defaultTenant",
                "poolId", "backend", "rootKey", "headroomFraction"}) {
            for (String v : new String[] {"", " ", "\t\n"}) {
                assertEquals(key + " is set but empty: give it a value or leave it unset", refused(key, v).getMessage());
            }
        }
    }

    @Test
    void numbersAreAsciiDigitsOnly() {
        assertEquals(3, BridgeSettings.parse(Map.of("rank", "3")).rank);
        assertTrue(refused("rank", "\u0663").getMessage().endsWith(": '\\u0663'")); // ARABIC-INDIC DIGIT THREE
        assertTrue(refused("releaseLagSteps", "\uff11").getMessage().contains("releaseLagSteps must be an integer"));
        assertEquals(new BigDecimal("0.25"), BridgeSettings.parse(Map.of("headroomFraction", "0.25")).headroomFraction);
        assertTrue(refused("headroomFraction", "0.\u0665").getMessage().startsWith("headroomFraction must be a number in [0, 1)"));
        assertTrue(refused("strict", "tru\u0435").getMessage().startsWith("strict must be true or false")); // Cyrillic e
    }

    @Test
    void aRootKeyWithAControlCharacterIsRefusedWithoutShowingIt() {
        String m = refused("rootKey", "q7ZKVSHIELDROOTKEY\u0001b64").getMessage();
        assertTrue(m.startsWith("rootKey holds a control character: not shown"), m);
        assertFalse(m.contains("KVSHIELDROOTKEY"), m);
    }

    @Test
    void aPathWithAControlCharacterOrBlanksAroundItIsRefused() {
        assertTrue(refused("auditDir", "/var/log/kvshield\u0007").getMessage().startsWith("auditDir holds a control character"));
        assertTrue(refused("auditDir", "/var/log/kvshield ").getMessage().startsWith("auditDir must name a path"));
    }
}
