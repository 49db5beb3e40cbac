"""What keeps the browser image's chromium quiet: it makes no request the agent did not cause.

Chromium talks to its vendor on its own — autofill and password-leak checks, safe browsing
lists, component and variations updates, metrics, translation, DNS prefetch and preconnect,
HTTPS upgrades that try https:// before the http:// URL the agent asked for. In a sandbox all
of that would go to the egress proxy: refused under a strict policy, but filling the ledger,
and let out under a looser one. Two files in the browser image turn it off for every chromium
started in the guest, whoever starts it (the browser tool, or the agent's own shell):

- a managed policy (/etc/chromium/policies/managed/), which the browser obeys and flags
  cannot override;
- a file sourced by Debian's /usr/bin/chromium wrapper (/etc/chromium.d/), which removes
  Debian's Google API keys from the environment and adds the switches for what has no policy.

Both are part of the image recipe, so of its content hash: changing them builds a new image.
One thing neither can do: chromium fetches a spell-check dictionary on the first keystroke in
a text field even with spell checking off by policy; only a profile preference stops it, so
the browser tool's driver starts chromium on a fresh profile that has none
(`aamp.guest.browser_session.PROFILE_PREFERENCES`).
"""

from __future__ import annotations

import json

POLICY: dict[str, object] = {
    "AlternateErrorPagesEnabled": False,
    "AutofillAddressEnabled": False,
    "AutofillCreditCardEnabled": False,
    "BackgroundModeEnabled": False,
    "BlockExternalExtensions": True,
    "BrowserSignin": 0,
    "BuiltInDnsClientEnabled": False,
    "ChromeVariations": 2,
    "ComponentUpdatesEnabled": False,
    "DefaultBrowserSettingEnabled": False,
    "DefaultGeolocationSetting": 2,
    "DefaultNotificationsSetting": 2,
    "DefaultSearchProviderEnabled": False,
    "DnsOverHttpsMode": "off",
    "DomainReliabilityAllowed": False,
    "EnableMediaRouter": False,
    "ExtensionInstallBlocklist": ["*"],
    "FeedbackSurveysEnabled": False,
    "HttpsOnlyMode": "disallowed",
    "HttpsUpgradesEnabled": False,
    "ImportAutofillFormData": False,
    "ImportSavedPasswords": False,
    "MediaRecommendationsEnabled": False,
    "MetricsReportingEnabled": False,
    "NetworkPredictionOptions": 2,
    "PasswordLeakDetectionEnabled": False,
    "PasswordManagerEnabled": False,
    "PasswordSharingEnabled": False,
    "PaymentMethodQueryEnabled": False,
    "PrivacySandboxAdMeasurementEnabled": False,
    "PrivacySandboxAdTopicsEnabled": False,
    "PrivacySandboxPromptEnabled": False,
    "PrivacySandboxSiteEnabledAdsEnabled": False,
    "PromotionalTabsEnabled": False,
    "QuicAllowed": False,
    "RelatedWebsiteSetsEnabled": False,
    "SafeBrowsingDeepScanningEnabled": False,
    "SafeBrowsingExtendedReportingEnabled": False,
    "SafeBrowsingProtectionLevel": 0,
    "SafeBrowsingSurveysEnabled": False,
    "SearchSuggestEnabled": False,
    "ShoppingListEnabled": False,
    "SpellCheckServiceEnabled": False,
    "SpellcheckEnabled": False,
    "SyncDisabled": True,
    "TranslateEnabled": False,
    "UrlKeyedAnonymizedDataCollectionEnabled": False,
    "UserFeedbackAllowed": False,
    "WPADQuickCheckEnabled": False,
}

# Where chromium's own services would otherwise be: an address on the guest's loopback where
# nothing listens. Chromium never sends loopback through a proxy, so a request to one of these
# ends in the guest, refused, and never reaches the egress proxy. (Sign-in's account check
# and the push-messaging check-in run even with sign-in and sync off.)
NOWHERE = "http://127.0.0.1:9"
SERVICE_URLS = (
    f"--gaia-url={NOWHERE}",
    f"--google-apis-url={NOWHERE}",
    f"--lso-url={NOWHERE}",
    f"--gcm-checkin-url={NOWHERE}/checkin",
    f"--gcm-registration-url={NOWHERE}/register",
    "--gcm-mcs-endpoint=https://127.0.0.1:9",
)

# Switches for what no policy covers. (--disable-features takes one list: a later switch of
# the same name replaces it, so callers should not pass their own.)
FLAGS = (
    *SERVICE_URLS,
    "--disable-background-networking",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-component-update",
    "--disable-crash-reporter",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-field-trial-config",
    "--disable-search-engine-choice-screen",
    "--disable-sync",
    "--metrics-recording-only",
    "--no-default-browser-check",
    "--no-first-run",
    "--no-pings",
    "--no-service-autorun",
    "--password-store=basic",
    "--disable-features="
    + ",".join(
        (
            "AutofillServerCommunication",
            "CertificateTransparencyComponentUpdater",
            "DialMediaRouteProvider",
            "HttpsFirstBalancedModeAutoEnable",
            "HttpsUpgrades",
            "InterestFeedContentSuggestions",
            "MediaRouter",
            "NetworkTimeServiceQuerying",
            "OptimizationGuideModelDownloading",
            "OptimizationHints",
            "OptimizationHintsFetching",
            "Translate",
        )
    ),
)

WRAPPER_SETTINGS = f"""# aamp: chromium in a sandbox makes no traffic of its own.
# See aamp.sandbox.browser_quiet. Sourced by /usr/bin/chromium after Debian's
# files, so it has the last word.
unset GOOGLE_API_KEY GOOGLE_DEFAULT_CLIENT_ID GOOGLE_DEFAULT_CLIENT_SECRET
aamp_kept=""
for aamp_flag in $CHROMIUM_FLAGS; do
  case "$aamp_flag" in
    --enable-remote-extensions|--load-extension=*) ;;
    *) aamp_kept="$aamp_kept $aamp_flag" ;;
  esac
done
export CHROMIUM_FLAGS="$aamp_kept {" ".join(FLAGS)}"
unset aamp_kept aamp_flag
"""

FILES: tuple[tuple[str, str], ...] = (
    ("etc/chromium/policies/managed/aamp-quiet.json", json.dumps(POLICY, indent=2) + "\n"),
    ("etc/chromium.d/zz-aamp-quiet", WRAPPER_SETTINGS),
)
